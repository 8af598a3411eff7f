package runs

import "testing"

// Issued ids sort as their times, after every id of another form in the run, and their
// time reads back; an id of another form or run has none.
func TestIssuedIDs(t *testing.T) {
	from, to := IssuedIDRange("api-acme")
	a, b := IssuedIDPrefix("api-acme", 1<<60), IssuedIDPrefix("api-acme", 1<<60+1)
	if !(from < a && a < b && b < to) {
		t.Errorf("%s, %s not in order within %s .. %s", a, b, from, to)
	}
	for _, other := range []string{"api-acme-ffffffffffffffffffffffffffffffffffffffff", EpisodeID("api-acme", 9_999_999)} {
		if other >= from {
			t.Errorf("%s sorts after the issued ids' start %s", other, from)
		}
	}
	for _, c := range []struct {
		id   string
		at   uint64
		want bool
	}{
		{a + "a1a1a1a1", 1 << 60, true},
		{IssuedIDPrefix("api-acme", 0), 0, true},
		{IssuedIDPrefix("api-acme", 1<<64-1), 1<<64 - 1, true},
		{"api-acme-v0123", 0, false},
		{"api-acme-v10000000000000G0", 0, false},
		{"api-acme-v1000000000000A00", 0, false},
		{IssuedIDPrefix("api-other", 5), 0, false},
		{"api-acme-0123456789abcdef0123456789abcdef01234567", 0, false},
	} {
		at, ok := IssuedAt("api-acme", c.id)
		if ok != c.want || at != c.at {
			t.Errorf("IssuedAt(%q) = %d, %v; want %d, %v", c.id, at, ok, c.at, c.want)
		}
	}
}
