package catalogue

import "testing"

// TestRowsAreWhole checks that every row of the catalogue that acts on events says what
// it does when it fires, and that the resource rows, which act on the sandbox, do not
// claim events: a row missing its decision would panic in Decide.
func TestRowsAreWhole(t *testing.T) {
	ranks := map[int]string{}
	for _, k := range kinds {
		switch {
		case k.Layer == LayerResource && (k.ops != 0 || k.decide != nil):
			t.Errorf("%s: a resource kind acts on events", k.Name)
		case k.Layer != LayerResource && (k.ops == 0 || k.decide == nil):
			t.Errorf("%s: acts on no event or has no decision", k.Name)
		}
		if p := k.FromLog; p != nil {
			if p.Match == nil {
				t.Errorf("%s: log pattern without a regexp", k.Name)
			}
			if other, dup := ranks[p.Rank]; dup {
				t.Errorf("%s: log pattern rank %d is also %s's: the first match would depend on row order", k.Name, p.Rank, other)
			}
			ranks[p.Rank] = k.Name
		}
	}
}
