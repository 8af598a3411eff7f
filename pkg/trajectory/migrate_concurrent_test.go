package trajectory

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/chlocal/chtest"
)

// TestMigrateConcurrentlyOnOneServer starts three stores' migrations at once against
// one server, as a split deployment's stores do when they start together, on fresh
// databases several times over: every one must succeed and leave the schema a lone
// migration leaves.
func TestMigrateConcurrentlyOnOneServer(t *testing.T) {
	ctx := context.Background()
	srv := chtest.Start(t)
	lone, err := Connect(ctx, srv.Addr(), "lone")
	if err != nil {
		t.Fatal(err)
	}
	defer lone.Close()
	if err := Migrate(ctx, lone, "lone"); err != nil {
		t.Fatal(err)
	}
	want := schemaOf(ctx, t, lone, "lone")

	const rounds, stores = 4, 3
	for r := range rounds {
		db := fmt.Sprintf("together%d", r)
		var wg sync.WaitGroup
		errs := make([]error, stores)
		for i := range stores {
			conn, err := Connect(ctx, srv.Addr(), db)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = Migrate(ctx, conn, db)
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("round %d, store %d: %v", r, i+1, err)
			}
		}
		if got := schemaOf(ctx, t, lone, db); !reflect.DeepEqual(got, want) {
			t.Errorf("round %d: the schema three stores left differs from a lone migration's:\n%v\nwant %v", r, got, want)
		}
	}
}
