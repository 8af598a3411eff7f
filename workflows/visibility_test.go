package workflows

import (
	"context"
	"errors"
	"testing"

	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/gauntlet-rl/gauntlet/pkg/temporallocal"
	"github.com/gauntlet-rl/gauntlet/pkg/temporallocal/temporaltest"
)

// TestEnsureSearchAttributesRegistersThem: on a dev server started without gauntlet's
// search attributes (another team's Temporal, say), EnsureSearchAttributes registers
// them with their types, and a second call finds them there.
func TestEnsureSearchAttributesRegistersThem(t *testing.T) {
	ctx := context.Background()
	srv := temporaltest.Start(t)
	c, err := client.DialContext(ctx, client.Options{HostPort: srv.Addr(), Namespace: temporallocal.Namespace})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	list := func() map[string]string {
		t.Helper()
		resp, err := c.OperatorService().ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: temporallocal.Namespace})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for name, typ := range resp.GetCustomAttributes() {
			out[name] = typ.String()
		}
		return out
	}
	before := list()
	for name := range SearchAttributes {
		if _, ok := before[name]; ok {
			t.Fatalf("%s registered before the test registers it", name)
		}
	}
	for range 2 {
		if err := EnsureSearchAttributes(ctx, c, temporallocal.Namespace); err != nil {
			t.Fatal(err)
		}
	}
	after := list()
	for name, typ := range SearchAttributes {
		if got := after[name]; got != typ {
			t.Errorf("%s registered as %q; want %s", name, got, typ)
		}
	}
}

func TestProgressOf(t *testing.T) {
	p := Progress{Name: "c", Status: StatusAborted, Stage: 1}
	got, ok := ProgressOf(temporal.NewCanceledError(p))
	if !ok || got.Status != StatusAborted || got.Stage != 1 {
		t.Errorf("ProgressOf(canceled with progress) = %+v, %v", got, ok)
	}
	if _, ok := ProgressOf(errors.New("boom")); ok {
		t.Error("ProgressOf(another error) = ok")
	}
	if _, ok := ProgressOf(temporal.NewCanceledError()); ok {
		t.Error("ProgressOf(canceled without details) = ok")
	}
}
