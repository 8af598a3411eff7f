package chlocal_test

import (
	"context"
	"strings"
	"testing"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/gauntlet-rl/gauntlet/pkg/chlocal"
	"github.com/gauntlet-rl/gauntlet/pkg/chlocal/chtest"
)

// TestClusterReplicates: each replica of a started cluster has its own macros, sees both
// replicas in its cluster, and a replicated table written on one is read on the other.
func TestClusterReplicates(t *testing.T) {
	ctx := context.Background()
	_, replicas := chtest.StartCluster(t)
	conns := make([]clickhouse.Conn, len(replicas))
	for i, r := range replicas {
		conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{r.Addr()}})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conns[i] = conn
		var replica string
		if err := conn.QueryRow(ctx, "SELECT substitution FROM system.macros WHERE macro = 'replica'").Scan(&replica); err != nil || replica != r.Replica() {
			t.Errorf("replica %d: macro %q (%v), want %q", i+1, replica, err, r.Replica())
		}
		var n uint64
		if err := conn.QueryRow(ctx, "SELECT count() FROM system.clusters WHERE cluster = ?", chlocal.DefaultCluster).Scan(&n); err != nil || n != 2 {
			t.Errorf("replica %d: %d replicas in cluster %s (%v), want 2", i+1, n, chlocal.DefaultCluster, err)
		}
		for _, stmt := range []string{
			"CREATE DATABASE IF NOT EXISTS c",
			"CREATE TABLE IF NOT EXISTS c.t (k UInt32) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/c/t', '{replica}') ORDER BY k",
		} {
			if err := conn.Exec(ctx, stmt); err != nil {
				t.Fatalf("replica %d: %s: %v", i+1, stmt, err)
			}
		}
	}
	batch, err := conns[0].PrepareBatch(ctx, "INSERT INTO c.t (k)")
	if err != nil {
		t.Fatal(err)
	}
	for k := range uint32(10) {
		if err := batch.Append(k); err != nil {
			t.Fatal(err)
		}
	}
	if err := batch.Send(); err != nil {
		t.Fatal(err)
	}
	// A replica fetches new parts at once; this waits for the fetch, not a schedule.
	var n uint64
	if err := conns[1].Exec(ctx, "SYSTEM SYNC REPLICA c.t"); err != nil {
		t.Fatal(err)
	}
	if err := conns[1].QueryRow(ctx, "SELECT count() FROM c.t").Scan(&n); err != nil || n != 10 {
		t.Fatalf("the other replica holds %d rows (%v), want 10", n, err)
	}
}

// TestReplicationErrors: a replica's settings that cannot work are refused before a
// server starts, each named.
func TestReplicationErrors(t *testing.T) {
	_, err := chlocal.Start(context.Background(), chlocal.Options{Dir: t.TempDir(), TCPPort: 9, Replication: &chlocal.Replication{
		Cluster: "no-dashes", Replicas: []string{"127.0.0.1:10"},
	}})
	if err == nil {
		t.Fatal("Start with a broken replication config succeeded")
	}
	for _, want := range []string{"cluster", "replica: must not be empty", "zookeeper", "must list this server's TCPPort 9"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}
