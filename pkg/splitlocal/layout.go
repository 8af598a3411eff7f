package splitlocal

// Target is one kind of gauntlet process of the split stack: what `gauntlet serve
// --target=` runs, and how many of it.
type Target struct {
	// Name is the --target value and the process's name (with its ordinal: worker-2).
	Name string
	// Count is how many processes of it the local split stack runs.
	Count int
}

// Layout is the split stack: one scheduler leader and its hot standby (the leader lease
// lives in KV, services/scheduler), three workers sharing the worker consumer, two of
// each request/reply service (queue groups), two stores sharing the store consumer, the
// env API and the curriculum worker. Stores come first: each migrates ClickHouse at start.
var Layout = []Target{
	{Name: "store", Count: 2},
	{Name: "faults", Count: 2},
	{Name: "reward", Count: 2},
	{Name: "scheduler", Count: 2},
	{Name: "worker", Count: 3},
	{Name: "envapi", Count: 1},
	{Name: "curriculum", Count: 1},
}

// HTTPPort is the port of /ready, /metrics and /modules every gauntlet process of a
// container deployment listens on (on loopback, each local process gets a free one).
const HTTPPort = 9464

// NATSNodes is the size of the NATS cluster; StreamReplicas is the replicas of every
// gauntlet stream and KV bucket on it: all nodes, so losing one loses no stream.
const (
	NATSNodes      = 3
	StreamReplicas = 3
)

// ClickHouseReplicas is the local split stack's ClickHouse: two replicas of one shard
// (ReplicatedReplacingMergeTree behind Distributed tables, coordinated by ZooKeeper), so
// that losing one loses no write and stops no store.
const ClickHouseReplicas = 2
