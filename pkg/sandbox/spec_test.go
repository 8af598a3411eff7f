package sandbox

import (
	"errors"
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

// TestValidateLinks: a link is one folder at the root leading to a workspace folder; it
// may not hide a folder the runtime provides, nor lead out of the workspace.
func TestValidateLinks(t *testing.T) {
	good := Spec{Links: map[string]string{"/app": "app", "/logs": "logs/x"}}
	if err := good.Validate(); err != nil {
		t.Errorf("good links: %v", err)
	}
	for _, c := range []struct {
		links map[string]string
		want  string
	}{
		{map[string]string{"app": "app"}, `"app" must be one folder at the root`},
		{map[string]string{"/": "app"}, `"/" must be one folder at the root`},
		{map[string]string{"/a/b": "app"}, `"/a/b" must be one folder at the root`},
		{map[string]string{"/..": "app"}, `"/.." must be one folder at the root`},
		{map[string]string{"/usr": "app"}, "would hide the sandbox's own /usr"},
		{map[string]string{"/workspace": "app"}, "would hide"},
		{map[string]string{"/app": "../etc"}, "links[/app]: \"../etc\" leaves the workspace"},
		{map[string]string{"/app": "/etc"}, "links[/app]: \"/etc\" is absolute"},
	} {
		err := Spec{Links: c.links}.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, ErrInvalid) {
			t.Errorf("links %v: %v, want ErrInvalid saying %q", c.links, err, c.want)
		}
	}
}
