package temporallocal_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/gauntlet-rl/gauntlet/pkg/temporallocal"
	"github.com/gauntlet-rl/gauntlet/pkg/temporallocal/temporaltest"
)

func TestStartRestartKeepsWorkflows(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local server; -short runs unit tests only")
	}
	srv := temporaltest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.DialContext(ctx, client.Options{HostPort: srv.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// No worker polls this queue: the workflow just waits, recorded in SQLite.
	if _, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "kept", TaskQueue: "nobody"}, "Nothing"); err != nil {
		t.Fatal(err)
	}
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-srv.Done():
	default:
		t.Fatal("Done not closed after Kill")
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	d, err := c.DescribeWorkflow(ctx, "kept", "")
	if err != nil {
		t.Fatalf("workflow lost across a restart: %v", err)
	}
	if st := d.RawResponse.GetWorkflowExecutionInfo().GetStatus(); st != enums.WORKFLOW_EXECUTION_STATUS_RUNNING {
		t.Errorf("status %v after restart; want running", st)
	}
	if srv.UIURL() != "" {
		t.Errorf("headless server has a UI URL %q", srv.UIURL())
	}
}

func TestStartWithUI(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local server; -short runs unit tests only")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := temporallocal.Start(ctx, temporallocal.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop(ctx)
	if srv.UIURL() == "" {
		t.Fatal("no UI URL")
	}
	// The Web UI serves its page (it may come up just after the frontend).
	var last error
	for deadline := time.Now().Add(20 * time.Second); ; {
		resp, err := http.Get(srv.UIURL())
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
			err = fmt.Errorf("status %s", resp.Status)
		}
		last = err
		if time.Now().After(deadline) {
			t.Fatalf("web UI %s: %v", srv.UIURL(), last)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := srv.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if srv.Pid() != 0 {
		t.Errorf("pid %d after Stop", srv.Pid())
	}
}

func TestMissingBinary(t *testing.T) {
	_, err := temporallocal.Start(context.Background(), temporallocal.Options{Dir: t.TempDir(), Binary: "/nonexistent/temporal"})
	if !errors.Is(err, temporallocal.ErrNotInstalled) {
		t.Fatalf("error %v; want ErrNotInstalled", err)
	}
}
