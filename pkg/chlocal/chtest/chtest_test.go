package chtest_test

import (
	"context"
	"testing"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/gauntlet-rl/gauntlet/pkg/chlocal/chtest"
)

func TestStart(t *testing.T) {
	srv := chtest.Start(t)
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{srv.Addr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.Ping(context.Background()); err != nil {
		t.Fatalf("ping %s: %v", srv.Addr(), err)
	}
}
