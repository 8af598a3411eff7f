// Package splitlocal runs gauntlet in split mode on one machine: a NATS JetStream cluster
// (pkg/natslocal, 3 nodes, every stream and KV bucket at 3 replicas), a replicated
// ClickHouse (pkg/zklocal's ZooKeeper and two pkg/chlocal replicas, or one server when
// asked), the Temporal dev server (pkg/temporallocal), and each gauntlet service as
// a separate `gauntlet serve --target=...` process, as many of each as [Layout] says.
//
// It is the code behind `gauntlet split up` (and so scripts/split.sh) and behind the
// end-to-end tests that kill a NATS node, a worker, a store, the scheduler leader or a
// ClickHouse replica mid-run: what the tests prove is what the script runs. [Layout] is also the one list of
// targets and counts that deploy/compose and deploy/kubernetes are checked against.
//
// Ownership: a [Stack] owns every process it started and the files under Options.Dir (one
// folder per server and per gauntlet process: its data dir and its log). Every process is
// a [childproc.Daemon] dying with this program, and is supervised while [Stack.Run] runs:
// one that exits without being stopped (a crash, a kill -9) is started again on the same
// ports and data, as a Kubernetes Deployment would.
//
// Concurrency: the methods of Stack are safe for concurrent use.
package splitlocal
