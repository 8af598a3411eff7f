// Package natslocal runs a NATS JetStream cluster of nats-server processes on loopback,
// as children of the calling program, with all of their state under one directory.
//
// It exists to prove split mode on one machine (scripts/split.sh, cmd/gauntlet's split
// tests): gauntlet's services as separate processes against a real clustered JetStream,
// whose nodes can be killed and restarted mid-run. The servers are of the version gauntlet
// embeds (the github.com/nats-io/nats-server/v2 of go.mod), built from the module by
// scripts/nats-server.sh; [Start] refuses a binary of another version, so the cluster a
// test kills nodes of is the server the all-in-one stack runs in process. Production runs
// its own NATS cluster (deploy/kubernetes/nats) and never uses this package.
//
// Ownership: the [Cluster] owns its server processes and the files under Options.Dir (a
// config file, a JetStream store, a log and a pid file per node). Each node keeps its
// ports and store across [Cluster.Kill] and [Cluster.Restart], so a restarted node rejoins
// with its data and catches up from its peers. Each node is a [childproc.Daemon]: it dies
// with this program, and a node left over by a crashed run on the same Dir is killed by
// the next Start.
//
// Concurrency: every method of Cluster is safe for concurrent use.
//
// Errors: Start fails with an error wrapping [ErrNotInstalled] when no binary is found and
// [ErrWrongVersion] when the binary is not the embedded version; every error names the
// operation and the node.
package natslocal
