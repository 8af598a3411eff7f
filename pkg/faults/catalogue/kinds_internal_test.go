package catalogue

import "testing"

// TestRowsAreWhole checks that every row of the catalogue that acts on events says what
// it does when it fires, and that the resource rows say what they ask of the sandbox and
// claim no events: a row missing its decision would panic in Decide.
func TestRowsAreWhole(t *testing.T) {
	ranks := map[int]string{}
	for _, k := range kinds {
		switch {
		case k.Layer == LayerResource && (k.ops != 0 || k.decide != nil || k.ambient == nil):
			t.Errorf("%s: a resource kind acts on events or has no ambient effect", k.Name)
		case k.Layer != LayerResource && (k.ops == 0 || k.decide == nil || k.ambient != nil):
			t.Errorf("%s: acts on no event, has no decision or claims an ambient effect", k.Name)
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
