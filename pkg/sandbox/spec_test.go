package sandbox

import (
	"regexp"
	"strings"
	"testing"
)

// TestNameCheckersMatchTheirPatterns checks ValidID and validServiceName, written by hand
// so that the containerd agent does not link regexp, against the patterns they implement.
func TestNameCheckersMatchTheirPatterns(t *testing.T) {
	idRE := regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)
	svcRE := regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`)
	cases := []string{
		"", "a", "A", "0", "_", "-", "a_", "a-", "sb-0123abcdef", "Z9_-x", "a.b", "a/b", "a b", "é", "aé",
		"x\n", "\nx", "-a", "_a", "a\x00", strings.Repeat("a", 32), strings.Repeat("a", 33),
		strings.Repeat("b", 64), strings.Repeat("b", 65), "api", "db-1", "Api", "1db", "a--", "ab_c",
	}
	for _, c := range cases {
		if got, want := ValidID(c), idRE.MatchString(c); got != want {
			t.Errorf("ValidID(%q) = %v, want %v", c, got, want)
		}
		if got, want := validServiceName(c), svcRE.MatchString(c); got != want {
			t.Errorf("validServiceName(%q) = %v, want %v", c, got, want)
		}
	}
}
