package chlocal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/childproc"
)

// ClusterOptions configures StartCluster.
type ClusterOptions struct {
	// Dir holds one folder per replica, replica-1, replica-2 and so on. Required.
	Dir string
	// ZooKeeper are the coordinator's client addresses (host:port), pkg/zklocal's
	// Server.Addr say. Required.
	ZooKeeper []string
	// Replicas is the number of replicas of the one shard; 0 means 2.
	Replicas int
	// Cluster names the cluster; empty means DefaultCluster.
	Cluster string
	// SessionTimeout is the ZooKeeper session timeout; 0 means DefaultSessionTimeout.
	SessionTimeout time.Duration
	// Logger receives lifecycle messages; nil discards them.
	Logger *slog.Logger
	// StartTimeout bounds each replica's start as Options.StartTimeout does.
	StartTimeout time.Duration
}

// StartCluster starts a one-shard replicated ClickHouse cluster on 127.0.0.1: every
// replica a Server of its own (so a test can kill one and restart it), named r1, r2, …
// in the {replica} macro, all listing each other in remote_servers. Ports are picked
// before the first start, since every replica's config names every other's; a port
// taken in between fails the start rather than moving one replica.
//
// On error, the replicas already started are killed.
func StartCluster(ctx context.Context, opts ClusterOptions) ([]*Server, error) {
	n := opts.Replicas
	if n == 0 {
		n = 2
	}
	if n < 1 {
		return nil, fmt.Errorf("start clickhouse cluster: %d replicas", n)
	}
	ports, err := childproc.FreePorts(make([]int, n)...)
	if err != nil {
		return nil, fmt.Errorf("start clickhouse cluster: %w", err)
	}
	addrs := make([]string, n)
	for i, p := range ports {
		addrs[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
	}
	var servers []*Server
	for i := range n {
		srv, err := Start(ctx, Options{
			Dir:          filepath.Join(opts.Dir, "replica-"+strconv.Itoa(i+1)),
			TCPPort:      ports[i],
			Logger:       opts.Logger,
			StartTimeout: opts.StartTimeout,
			Replication: &Replication{
				ZooKeeper:      opts.ZooKeeper,
				Cluster:        opts.Cluster,
				Replica:        "r" + strconv.Itoa(i+1),
				Replicas:       addrs,
				SessionTimeout: opts.SessionTimeout,
			},
		})
		if err != nil {
			for _, s := range servers {
				err = errors.Join(err, s.Kill())
			}
			return nil, fmt.Errorf("start clickhouse cluster: replica %d: %w", i+1, err)
		}
		servers = append(servers, srv)
	}
	return servers, nil
}

// Addrs returns the native addresses of servers, in order: the list a client that
// fails over from one replica to the next is given.
func Addrs(servers []*Server) []string {
	out := make([]string, len(servers))
	for i, s := range servers {
		out[i] = s.Addr()
	}
	return out
}
