package splitlocal

// Replicas says how many processes of a target deploy/ runs: in deploy/compose (one
// machine, one NATS server) and on Kubernetes (deploy/kubernetes: the Deployment's
// replicas, or its HorizontalPodAutoscaler's minReplicas when one owns the count). 0 means
// deploy/ does not run the target yet.
type Replicas struct {
	Compose, Kubernetes int
}

// Deployed is what deploy/ runs of each target of Layout. TestDeployMatchesTheFacts reads
// deploy/compose and deploy/kubernetes and fails on any difference, so the manifests,
// this table and Layout cannot drift apart. The env API and the curriculum worker are not
// deployed there yet: the curriculum worker needs a Temporal cluster the manifests do not
// describe, and the env API a Service and its tokens.
var Deployed = map[string]Replicas{
	"scheduler":  {Compose: 1, Kubernetes: 2}, // compose publishes the scheduler's 9464 on the host: one
	"worker":     {Compose: 2, Kubernetes: 2},
	"faults":     {Compose: 1, Kubernetes: 2},
	"reward":     {Compose: 1, Kubernetes: 2},
	"store":      {Compose: 1, Kubernetes: 2},
	"envapi":     {},
	"curriculum": {},
}

// ComposeStreamReplicas is nats.replicas in deploy/compose, whose single NATS server
// holds one replica of each stream.
const ComposeStreamReplicas = 1

// DeployedClickHouse is how many ClickHouse replicas of the one shard deploy/ runs:
// compose's clickhouse-1, clickhouse-2, … and the Kubernetes StatefulSet clickhouse's pods
// clickhouse-0, clickhouse-1, … (deploy/kubernetes/optional/clickhouse), as the local
// split stack runs ClickHouseReplicas. TestDeployMatchesTheFacts checks that each
// deployment's gauntlet.yaml names exactly those replicas and that their replica.xml
// lists them in the cluster's one shard.
var DeployedClickHouse = Replicas{Compose: 2, Kubernetes: 2}
