package console

import (
	"context"
	"testing"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/gauntlet-rl/gauntlet/pkg/chlocal"
	"github.com/gauntlet-rl/gauntlet/pkg/chlocal/chtest"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
)

// testDB is the database the console's tests against ClickHouse read, as a stack's.
const testDB = "gauntlet"

// migratedClickHouse starts a ClickHouse server for t, with testDB migrated as the store
// migrates it, and returns it with a connection to testDB closed when t ends. It skips
// t under -short.
func migratedClickHouse(t testing.TB) (*chlocal.Server, driver.Conn) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts ClickHouse; -short runs unit tests only")
	}
	srv := chtest.Start(t)
	ctx := context.Background()
	conn, err := trajectory.Connect(ctx, srv.Addr(), testDB)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := trajectory.Migrate(ctx, conn, testDB); err != nil {
		t.Fatal(err)
	}
	return srv, conn
}
