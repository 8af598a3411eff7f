package trajectory

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// migration is one step of the schema. Statements name tables as {db}.table; Migrate
// substitutes the database.
//
// Rules, because the same schema must run on ClickHouse 18.16 and on current releases:
//   - Never edit an applied migration: add a new one with the next version.
//   - Every statement is idempotent (IF NOT EXISTS, IF EXISTS), so a migration that
//     crashed half-way, or ran in two processes at once, can simply run again.
//   - No DateTime64, Map, JSON, Bool or LowCardinality types, no TTL, no CODEC
//     (all newer than 18.16): DateTime plus UInt64 nanoseconds, parallel arrays,
//     String and UInt8 instead.
//   - A view's columns are fixed when it is created: a migration that adds columns to
//     a table must drop and re-create the table's views. Migrate does it after the
//     migration's statements (rebuildViews, over the views declared in views), except
//     for the two migrations (ownViews) whose statements re-create them in between.
//     What Migrate runs for each migration is pinned, statement by statement, by
//     testdata/migration_statements.txt.
type migration struct {
	version uint32
	name    string
	// addColumns run before stmts, each only when its column is missing: 18.16 has no
	// ADD COLUMN IF NOT EXISTS.
	addColumns []addColumn
	stmts      []string
	// ownViews: the statements re-create the views over the tables addColumns changes,
	// not in the order rebuildViews would (migrations 6 and 10, as they were applied).
	ownViews bool
}

// view is a view over one table, created by the statements of migration created as
// CREATE VIEW IF NOT EXISTS {db}.name AS query (a test holds the two equal).
type view struct {
	name, table, query string
	created            uint32
}

// views are the schema's views, by the migration that created them. A view's query is
// never changed in place: a migration re-creating an older view would otherwise give it
// columns its table does not have yet. A new view over a table is declared here with
// the migration that creates it, and later migrations adding columns to the table
// re-create it.
var views = []view{
	{"steps_final", "steps", "SELECT * FROM {db}.steps FINAL", 1},
	{"episodes_final", "episodes", "SELECT * FROM {db}.episodes FINAL", 1},
	{"faults_final", "faults", "SELECT * FROM {db}.faults FINAL", 1},
	{"trainer_steps_final", "trainer_steps", "SELECT * FROM {db}.trainer_steps FINAL", 4},
	{"plan_templates_final", "plan_templates", "SELECT * FROM {db}.plan_templates FINAL", 5},
	{"runs_final", "runs", "SELECT * FROM {db}.runs FINAL", 6},
	{"curriculum_stages_final", "curriculum_stages", "SELECT * FROM {db}.curriculum_stages FINAL", 6},
	{"reward_specs_final", "reward_specs", "SELECT * FROM {db}.reward_specs FINAL", 7},
	{"episodes_scored", "episodes", "SELECT * FROM {db}.episodes FINAL WHERE infra_error = 0", 10},
	{"step_scores_final", "step_scores", "SELECT * FROM {db}.step_scores FINAL", 10},
	{"episode_worlds_final", "episode_worlds", "SELECT * FROM {db}.episode_worlds FINAL", 11},
}

// rebuildViews returns the statements that re-create, after m, the views over the
// tables m adds columns to: each view created before m, in the order of views, dropped
// then created again. Nothing for a migration whose statements do it (ownViews).
func rebuildViews(m migration) []string {
	if m.ownViews {
		return nil
	}
	var out []string
	for _, v := range views {
		if v.created >= m.version || !slices.ContainsFunc(m.addColumns, func(c addColumn) bool { return c.table == v.table }) {
			continue
		}
		out = append(out, "DROP TABLE IF EXISTS {db}."+v.name, "CREATE VIEW IF NOT EXISTS {db}."+v.name+" AS "+v.query)
	}
	return out
}

// addColumn adds one column to a table, after another column.
type addColumn struct {
	table, name, typ, after string
}

// migrations in version order, starting at 1, without gaps.
var migrations = []migration{
	{version: 1, name: "initial schema", stmts: []string{
		// One row per (episode_id, step). ReplacingMergeTree collapses redelivered
		// steps to one row in the background; readers use FINAL (or the _final views)
		// or GROUP BY for exact answers. requested_at is fixed per episode, so every
		// copy of a step lands in the same partition, where the collapse happens.
		`CREATE TABLE IF NOT EXISTS {db}.steps (
			run_id String,
			episode_id String,
			step UInt32,
			requested_at DateTime,
			env String,
			policy String,
			profile String,
			worker_id String,
			tool String,
			args String,
			observation String,
			state_diff String,
			fault_ids Array(String),
			fault_kinds Array(String),
			fault_targets Array(String),
			fault_details Array(String),
			tool_calls UInt32,
			errors UInt32,
			virtual_ns UInt64,
			wall_ns UInt64,
			bytes_in UInt32,
			bytes_out UInt32,
			progress Float64,
			invalid_action UInt8,
			success UInt8,
			violation_rules Array(String),
			violation_reasons Array(String),
			safety_events Array(String),
			spend Float64,
			terminated UInt8,
			truncated UInt8,
			reason String,
			virtual_time_ns UInt64,
			reward Float64,
			r_task Float64,
			r_cost Float64,
			r_safety Float64,
			r_timeliness Float64,
			r_causal Float64,
			reward_names Array(String),
			reward_values Array(Float64),
			reward_spec String,
			version UInt64
		) ENGINE = ReplacingMergeTree(version)
		PARTITION BY toYYYYMMDD(requested_at)
		ORDER BY (episode_id, step)`,

		// One row per episode, from EpisodeEnded.
		`CREATE TABLE IF NOT EXISTS {db}.episodes (
			run_id String,
			episode_id String,
			idx UInt64,
			env String,
			params String,
			seed UInt64,
			policy String,
			profile String,
			plan String,
			worker_id String,
			requested_at DateTime,
			started_at DateTime,
			ended_at DateTime,
			started_at_ns UInt64,
			ended_at_ns UInt64,
			steps UInt32,
			terminated UInt8,
			truncated UInt8,
			reason String,
			infra_error UInt8,
			error String,
			success UInt8,
			total_reward Float64,
			faults_fired UInt32,
			virtual_time_ns UInt64,
			version UInt64
		) ENGINE = ReplacingMergeTree(version)
		PARTITION BY toYYYYMMDD(requested_at)
		ORDER BY (run_id, episode_id)`,

		// One row per fired fault, seq being its index among the step's faults.
		`CREATE TABLE IF NOT EXISTS {db}.faults (
			run_id String,
			episode_id String,
			step UInt32,
			seq UInt16,
			requested_at DateTime,
			profile String,
			fault_id String,
			kind String,
			target String,
			detail String,
			at_virtual_ns Int64,
			version UInt64
		) ENGINE = ReplacingMergeTree(version)
		PARTITION BY toYYYYMMDD(requested_at)
		ORDER BY (episode_id, step, seq)`,

		// Exact, de-duplicated views for analysts (FINAL in a view works on 18.16).
		`CREATE VIEW IF NOT EXISTS {db}.steps_final AS SELECT * FROM {db}.steps FINAL`,
		`CREATE VIEW IF NOT EXISTS {db}.episodes_final AS SELECT * FROM {db}.episodes FINAL`,
		`CREATE VIEW IF NOT EXISTS {db}.faults_final AS SELECT * FROM {db}.faults FINAL`,
	}},
	{version: 2, name: "episode drift values", addColumns: []addColumn{
		// The drifted fault parameters in force for the episode, as parallel arrays:
		// drift_selectors[i] held drift_values[i], set by drift_sources[i] (run or global).
		{"episodes", "drift_selectors", "Array(String)", "version"},
		{"episodes", "drift_values", "Array(Float64)", "drift_selectors"},
		{"episodes", "drift_sources", "Array(String)", "drift_values"},
	}},
	// What a real sandbox measured around each step; zero for sim steps.
	{version: 3, name: "sandbox metering in steps",
		addColumns: []addColumn{
			{"steps", "cpu_ns", "UInt64", "bytes_out"},
			{"steps", "peak_memory_bytes", "UInt64", "cpu_ns"},
			{"steps", "processes", "UInt32", "peak_memory_bytes"},
			{"steps", "read_bytes", "UInt64", "processes"},
			{"steps", "written_bytes", "UInt64", "read_bytes"},
			{"steps", "runtime", "String", "written_bytes"},
		}},
	{version: 4, name: "trainer data of env API steps", stmts: []string{
		// One row per (episode_id, step) a trainer attached data to (token ids,
		// logprobs, policy version); large, so apart from steps. Join on
		// (episode_id, step).
		`CREATE TABLE IF NOT EXISTS {db}.trainer_steps (
			run_id String,
			episode_id String,
			step UInt32,
			requested_at DateTime,
			policy_version String,
			prompt_token_ids Array(UInt32),
			completion_token_ids Array(UInt32),
			logprobs Array(Float32),
			version UInt64
		) ENGINE = ReplacingMergeTree(version)
		PARTITION BY toYYYYMMDD(requested_at)
		ORDER BY (episode_id, step)`,
		`CREATE VIEW IF NOT EXISTS {db}.trainer_steps_final AS SELECT * FROM {db}.trainer_steps FINAL`,
	}},
	// Plans recorded by reference: an episode's plan is its profile, plan seed,
	// catalogue version, drift values and, for a user-defined profile, its template (one
	// row in plan_templates, shared by every episode of the profile); plan_digest checks
	// a re-derivation (pkg/faults/plans.Expand). The plan column keeps whole plans of older rows.
	{version: 5, name: "fault plans by reference",
		addColumns: []addColumn{
			{"episodes", "plan_seed", "UInt64", "drift_sources"},
			{"episodes", "catalogue_version", "String", "plan_seed"},
			{"episodes", "plan_template", "String", "catalogue_version"},
			{"episodes", "plan_digest", "String", "plan_template"},
		},
		stmts: []string{
			`CREATE TABLE IF NOT EXISTS {db}.plan_templates (
				template String,
				profile String,
				catalogue_version String,
				plan String,
				version UInt64
			) ENGINE = ReplacingMergeTree(version)
			ORDER BY template`,
			`CREATE VIEW IF NOT EXISTS {db}.plan_templates_final AS SELECT * FROM {db}.plan_templates FINAL`,
		}},
	// Where runs come from and how curricula move (lineage.go): one row per run, from the
	// scheduler's run state and the run's origin, rewritten as the run goes on (the
	// version is the state's update time), and one row per closed curriculum stage.
	// And where each step's time went besides the env (steps.wall_ns): the policy and the
	// reward service.
	{version: 6, name: "run and curriculum metadata, step latency", ownViews: true, addColumns: []addColumn{
		{"steps", "policy_ns", "UInt64", "runtime"},
		{"steps", "reward_ns", "UInt64", "policy_ns"},
	}, stmts: []string{
		`DROP TABLE IF EXISTS {db}.steps_final`,
		`CREATE VIEW IF NOT EXISTS {db}.steps_final AS SELECT * FROM {db}.steps FINAL`,
		`CREATE TABLE IF NOT EXISTS {db}.runs (
			run_id String,
			label String,
			env String,
			params String,
			policy_mix String,
			profile_mix String,
			profile_files Array(String),
			custom_profiles Array(String),
			drift_text String,
			drift_selectors Array(String),
			seed UInt64,
			episodes UInt64,
			max_in_flight UInt32,
			max_steps UInt32,
			reward_spec String,
			curriculum_id String,
			curriculum_name String,
			curriculum_prefix String,
			stage UInt32,
			stage_name String,
			batch UInt32,
			gauntlet_version String,
			submitted_by String,
			submitted_at DateTime,
			submitted_at_ns UInt64,
			started_at DateTime,
			started_at_ns UInt64,
			finished_at DateTime,
			finished_at_ns UInt64,
			state String,
			error String,
			assigned UInt64,
			ended UInt64,
			succeeded UInt64,
			steps UInt64,
			faults_fired UInt64,
			infra_errors UInt64,
			reward_sum Float64,
			version UInt64
		) ENGINE = ReplacingMergeTree(version)
		ORDER BY run_id`,
		`CREATE VIEW IF NOT EXISTS {db}.runs_final AS SELECT * FROM {db}.runs FINAL`,
		`CREATE TABLE IF NOT EXISTS {db}.curriculum_stages (
			curriculum_id String,
			curriculum_name String,
			curriculum_prefix String,
			stage UInt32,
			stage_name String,
			outcome String,
			metric String,
			threshold Float64,
			window_episodes UInt64,
			window_value Float64,
			episodes UInt64,
			succeeded UInt64,
			reward_sum Float64,
			batches UInt32,
			next_stage UInt32,
			closed_at DateTime,
			closed_at_ns UInt64,
			version UInt64
		) ENGINE = ReplacingMergeTree(version)
		ORDER BY (curriculum_prefix, stage)`,
		`CREATE VIEW IF NOT EXISTS {db}.curriculum_stages_final AS SELECT * FROM {db}.curriculum_stages FINAL`,
	}},
	// Reward specs by digest: each step and episode records the digest of the spec it
	// was scored under (pkg/scoring.Spec.Digest; steps.reward_spec keeps its name/version),
	// and reward_specs holds each spec once, its file and its components' names, weights
	// and rules as parallel arrays, so a total can be rebuilt in SQL (docs/querying.md).
	{version: 7, name: "reward specs",
		addColumns: []addColumn{
			{"steps", "reward_spec_digest", "String", "reward_spec"},
			{"episodes", "reward_spec_digest", "String", "plan_digest"},
		},
		stmts: []string{
			`CREATE TABLE IF NOT EXISTS {db}.reward_specs (
				digest String,
				spec String,
				name String,
				spec_version String,
				source String,
				components Array(String),
				weights Array(Float64),
				rules Array(String),
				version UInt64
			) ENGINE = ReplacingMergeTree(version)
			ORDER BY digest`,
			`CREATE VIEW IF NOT EXISTS {db}.reward_specs_final AS SELECT * FROM {db}.reward_specs FINAL`,
		}},
	// Runs of the tasks env record the tasks they cover: the dataset's name and the
	// tasks their params pin (pkg/env/taskenv.Selection), id and content digest in
	// parallel arrays, so an analyst sees which tasks a run covered without reading
	// its params' JSON.
	{version: 8, name: "runs record their tasks",
		addColumns: []addColumn{
			{"runs", "task_dataset", "String", "params"},
			{"runs", "task_ids", "Array(String)", "task_dataset"},
			{"runs", "task_digests", "Array(String)", "task_ids"},
		}},
	// Fork lineage: an episode forked from another (the env API's Fork) records the
	// episode it was forked from and the step (EpisodeRequested.parent_*).
	{version: 9, name: "fork lineage of episodes",
		addColumns: []addColumn{
			{"episodes", "parent_episode_id", "String", "reward_spec_digest"},
			{"episodes", "parent_step", "UInt32", "parent_episode_id"},
		}},
	// Typed infra errors: what failed (episodes.infra_kind).
	// Re-scoring (rescore.go): the signals scoring reads that steps did not record yet,
	// so a step row holds every input of its score (scoring_inputs = 1 says it does; 0 for
	// rows recorded before), and step_scores, the scores of recorded steps under other
	// specs, one row per (run, spec digest, episode, step).
	{version: 10, name: "scoring inputs in steps, re-scored steps, infra error kinds", ownViews: true,
		addColumns: []addColumn{
			{"steps", "progress_delta", "Float64", "reward_ns"},
			{"steps", "budget", "Float64", "progress_delta"},
			{"steps", "deadline_virtual_ns", "Int64", "budget"},
			{"steps", "violation_suggestions", "Array(String)", "deadline_virtual_ns"},
			{"steps", "scoring_inputs", "UInt8", "violation_suggestions"},
			// What failed in an infra error: model_endpoint, sandbox, verifier, gauntlet.
			{"episodes", "infra_kind", "String", "parent_step"},
		},
		stmts: []string{
			`DROP TABLE IF EXISTS {db}.episodes_final`,
			`CREATE VIEW IF NOT EXISTS {db}.episodes_final AS SELECT * FROM {db}.episodes FINAL`,
			// The episodes training statistics count: an infra error carries no reward.
			// Like the _final views, re-created by a migration that adds episodes columns.
			`CREATE VIEW IF NOT EXISTS {db}.episodes_scored AS SELECT * FROM {db}.episodes FINAL WHERE infra_error = 0`,
			`DROP TABLE IF EXISTS {db}.steps_final`,
			`CREATE VIEW IF NOT EXISTS {db}.steps_final AS SELECT * FROM {db}.steps FINAL`,
			// requested_at is the step's, fixed per episode, as in steps. version is
			// the time of the re-score: re-scoring again replaces a row with an equal one.
			`CREATE TABLE IF NOT EXISTS {db}.step_scores (
				run_id String,
				spec_digest String,
				episode_id String,
				step UInt32,
				requested_at DateTime,
				env String,
				spec String,
				reward Float64,
				reward_names Array(String),
				reward_values Array(Float64),
				version UInt64
			) ENGINE = ReplacingMergeTree(version)
			PARTITION BY toYYYYMMDD(requested_at)
			ORDER BY (run_id, spec_digest, episode_id, step)`,
			`CREATE VIEW IF NOT EXISTS {db}.step_scores_final AS SELECT * FROM {db}.step_scores FINAL`,
		}},
	// The world file each episode of a world env played: its name and the SHA-256 of
	// its bytes, from the episode's first observation, joined to episodes on
	// (run_id, episode_id) (docs/querying.md).
	{version: 11, name: "episode worlds", stmts: []string{
		`CREATE TABLE IF NOT EXISTS {db}.episode_worlds (
			run_id String,
			episode_id String,
			requested_at DateTime,
			world String,
			digest String,
			version UInt64
		) ENGINE = ReplacingMergeTree(version)
		PARTITION BY toYYYYMMDD(requested_at)
		ORDER BY (run_id, episode_id)`,
		`CREATE VIEW IF NOT EXISTS {db}.episode_worlds_final AS SELECT * FROM {db}.episode_worlds FINAL`,
	}},
	// The named numbers a task's verifier wrote (reward.txt as "reward", reward.json's
	// names), in parallel arrays sorted by name: on the verdict step, where reward specs
	// read them, and on the episode. Empty for every other step and env.
	{version: 12, name: "verifier rewards",
		addColumns: []addColumn{
			{"steps", "verifier_names", "Array(String)", "scoring_inputs"},
			{"steps", "verifier_values", "Array(Float64)", "verifier_names"},
			{"episodes", "verifier_names", "Array(String)", "infra_kind"},
			{"episodes", "verifier_values", "Array(Float64)", "verifier_names"},
		}},
	// Which agent acted, in a world of several agents (the role its action names,
	// "role:tool"); empty for every other env. Per-agent rewards are sums over it.
	{version: 13, name: "the agent of a step",
		addColumns: []addColumn{
			{"steps", "agent", "String", "tool"},
		}},
	// The model endpoint of a run's "http" policy (its URL, model and credential name,
	// never the secret), and a closed stage's infra errors, which its decisions leave
	// out.
	{version: 14, name: "policy endpoints of runs, infra errors of stages",
		addColumns: []addColumn{
			{"runs", "policy_url", "String", "reward_spec"},
			{"runs", "policy_model", "String", "policy_url"},
			{"runs", "policy_credential", "String", "policy_model"},
			{"curriculum_stages", "infra_errors", "UInt64", "reward_sum"},
		}},
	// The resource limits a step's sandbox hit (timeout, output_capped, ...), apart from
	// its safety events: honest programs hit them, so they are no attack. Earlier steps
	// hold theirs in safety_events and keep them there, scored as they were.
	// And a closed stage's infra errors by kind, as its report gives them.
	{version: 15, name: "limits apart from safety events, stage infra errors by kind",
		addColumns: []addColumn{
			{"steps", "limits", "Array(String)", "verifier_values"},
			{"curriculum_stages", "infra_kinds", "Array(String)", "infra_errors"},
			{"curriculum_stages", "infra_counts", "Array(UInt64)", "infra_kinds"},
		}},
	// Whether a run's "http" policy asks its endpoint for token ids and logprobs
	// (PolicyEndpoint.logprobs): "on", "off", or "" for the workers' own default (and
	// for runs of other policies).
	{version: 16, name: "logprobs choice of runs",
		addColumns: []addColumn{
			{"runs", "policy_logprobs", "String", "policy_credential"},
		}},
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// checkDatabase refuses names that would need quoting, so they can be spliced into SQL.
func checkDatabase(database string) error {
	if !identRE.MatchString(database) {
		return fmt.Errorf("invalid database name %q: want letters, digits and underscores", database)
	}
	return nil
}

// Migrate creates database if it is missing and applies, in version order, every
// migration not yet recorded in its schema_migrations table. Running it again, or in
// several processes at once, is harmless: statements are idempotent and applied
// versions are skipped.
//
// On a replica of a replicated cluster (a server whose config sets the shard, replica
// and cluster macros, as pkg/chlocal's replicated mode does) every table is created as
// a Replicated* table named table_local, with a Distributed table under the table's
// own name in front of it (see replicate): analysts, readers and the writer use the
// same names on either replica. schema_migrations stays a table of each server, since
// creating tables and views is each server's own; a column added to a replicated table
// reaches the other replicas through ZooKeeper, and the migration on the other replica
// then finds it there (ensureReplicatedColumn). To migrate every replica, see
// MigrateReplicas.
func Migrate(ctx context.Context, conn driver.Conn, database string) error {
	return migrateTo(ctx, conn, database, migrations[len(migrations)-1].version)
}

// migrateTo is Migrate applying the migrations up to version last only, as a database
// migrated by an older gauntlet is.
func migrateTo(ctx context.Context, conn driver.Conn, database string, last uint32) error {
	if err := checkDatabase(database); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if err := conn.Exec(ctx, "CREATE DATABASE IF NOT EXISTS "+database); err != nil {
		return fmt.Errorf("migrate: create database %s: %w", database, err)
	}
	cluster, err := replicationCluster(ctx, conn)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	err = conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+database+
		".schema_migrations (version UInt32, applied_at DateTime) ENGINE = MergeTree() ORDER BY version")
	if err != nil {
		return fmt.Errorf("migrate: create %s.schema_migrations: %w", database, err)
	}
	applied, err := appliedVersions(ctx, conn, database)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if cluster != "" && len(applied) > 0 {
		if err := checkReplicated(ctx, conn, database); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
	}
	for _, m := range migrations {
		if applied[m.version] || m.version > last {
			continue
		}
		for _, c := range m.addColumns {
			if cluster != "" {
				err = ensureReplicatedColumn(ctx, conn, database, c)
			} else {
				err = ensureColumn(ctx, conn, database, c)
			}
			if err != nil {
				return fmt.Errorf("migrate: apply %d (%s): %w", m.version, m.name, err)
			}
		}
		for i, stmt := range slices.Concat(m.stmts, rebuildViews(m)) {
			stmts := []string{stmt}
			if cluster != "" {
				if stmts, err = replicate(stmt, database, cluster, laterColumns(m.version)); err != nil {
					return fmt.Errorf("migrate: apply %d (%s) statement %d: %w", m.version, m.name, i+1, err)
				}
			}
			for _, st := range stmts {
				if err := conn.Exec(ctx, strings.ReplaceAll(st, "{db}", database)); err != nil {
					return fmt.Errorf("migrate: apply %d (%s) statement %d: %w", m.version, m.name, i+1, err)
				}
			}
		}
		if err := recordVersion(ctx, conn, database, m.version); err != nil {
			return fmt.Errorf("migrate: record %d (%s): %w", m.version, m.name, err)
		}
	}
	return nil
}

// MigrateReplicas runs Migrate on each server of addrs (host:port, the replicas of a
// replicated cluster), one after the other, each over a connection of its own. A
// replica that cannot be reached is logged and left for a later run (a store's next
// start, or the store's retry of an insert the replica refused): its replicated
// tables still receive every added column through ZooKeeper once it is back. It fails
// when a reachable replica's migration fails, or when no replica could be reached.
func MigrateReplicas(ctx context.Context, addrs []string, database string, log *slog.Logger) error {
	var unreached []error
	for _, addr := range addrs {
		conn, err := Connect(ctx, addr, database)
		if err != nil {
			log.Warn("replica unreachable; migrating it later", "addr", addr, "err", err)
			unreached = append(unreached, err)
			continue
		}
		err = migrateReplica(ctx, conn, database)
		conn.Close()
		if err != nil {
			return fmt.Errorf("migrate replica %s: %w", addr, err)
		}
	}
	if len(unreached) == len(addrs) {
		return fmt.Errorf("migrate replicas: none reachable: %w", errors.Join(unreached...))
	}
	return nil
}

// migrateReplica migrates a server that must be a replica: several independent servers
// given as replicas would each get tables of their own, and the store's failover would
// split the data between them.
func migrateReplica(ctx context.Context, conn driver.Conn, database string) error {
	cluster, err := replicationCluster(ctx, conn)
	if err != nil {
		return err
	}
	if cluster == "" {
		return fmt.Errorf("%w: the server is not a replica (no shard and replica macros), and several addresses are for the replicas of one cluster only", ErrMixedSchema)
	}
	return Migrate(ctx, conn, database)
}

// replicationCluster returns the cluster the server is a replica of: its cluster macro
// when it also has the shard and replica macros, "" for a single server.
func replicationCluster(ctx context.Context, conn driver.Conn) (string, error) {
	rows, err := conn.Query(ctx, "SELECT macro, substitution FROM system.macros")
	if err != nil {
		return "", fmt.Errorf("read system.macros: %w", err)
	}
	defer rows.Close()
	macros := make(map[string]string)
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return "", fmt.Errorf("read system.macros: %w", err)
		}
		macros[k] = v
	}
	if err := rows.Err(); err != nil {
		return "", fmt.Errorf("read system.macros: %w", err)
	}
	if macros["shard"] == "" || macros["replica"] == "" {
		return "", nil
	}
	cluster := macros["cluster"]
	if !identRE.MatchString(cluster) {
		return "", fmt.Errorf("%w: the server has shard and replica macros but its cluster macro %q does not name a cluster of remote_servers",
			ErrMixedSchema, cluster)
	}
	return cluster, nil
}

// ErrMixedSchema is wrapped by Migrate's error when a server's tables and its
// replication settings disagree: a database created by a single server on a server
// now configured as a replica, or a replica without a usable cluster macro; and by
// MigrateReplicas's when a server it is given is not a replica. Migrate
// changes nothing then; moving data between the two layouts is an operator's job
// (docs/architecture.md, Replicated ClickHouse).
var ErrMixedSchema = errors.New("schema and replication settings disagree")

// checkReplicated refuses a database whose steps table is not Distributed on a replica.
func checkReplicated(ctx context.Context, conn driver.Conn, database string) error {
	var engine string
	err := conn.QueryRow(ctx, "SELECT engine FROM system.tables WHERE database = ? AND name = 'steps'", database).Scan(&engine)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look up %s.steps: %w", database, err)
	}
	if engine != "Distributed" {
		return fmt.Errorf("%w: %s.steps is a %s table, created by a single server; a replica needs a fresh database", ErrMixedSchema, database, engine)
	}
	return nil
}

// createTableRE matches the migrations' CREATE TABLE statements and their engine.
var (
	createTableRE = regexp.MustCompile(`^(\s*CREATE TABLE IF NOT EXISTS \{db\}\.)([A-Za-z_][A-Za-z0-9_]*)(\s)`)
	engineRE      = regexp.MustCompile(`ENGINE = ([A-Za-z]*MergeTree)\(([^)]*)\)`)
)

// localSuffix names the replicated table behind each Distributed table.
const localSuffix = "_local"

// replicate turns one migration statement into what a replica of cluster runs: a
// CREATE TABLE becomes the table's Replicated* twin named table_local, created with the
// columns later migrations add (later) already in place, its state in
// ZooKeeper under /clickhouse/tables/{shard}/<database>/<table> ({shard} and
// {replica} are the server's macros), followed by a Distributed table under the
// original name over the cluster's table_local. The cluster has one shard whose
// replicas each hold every row (internal_replication: an insert goes to one replica,
// which replicates it), so a Distributed query reads one replica, the local one first,
// and FINAL collapses there exactly as on a single server. An insert into the
// Distributed table lands synchronously in the local replica's table. Every other
// statement (views, drops) is unchanged: views read the Distributed tables.
//
// Why the later columns: a replica's table must be created with the structure its
// table has in ZooKeeper, which is the latest the other replicas migrated to, not the
// structure of the migration that first created it. A replica migrated after another
// (or down while the other was migrated) then joins with the same columns, and the
// later migrations' ALTERs find their columns there.
func replicate(stmt, database, cluster string, later []addColumn) ([]string, error) {
	m := createTableRE.FindStringSubmatchIndex(stmt)
	if m == nil {
		if strings.Contains(stmt, "CREATE TABLE") {
			return nil, fmt.Errorf("cannot make a replicated twin of %.60q: not CREATE TABLE IF NOT EXISTS {db}.name", stmt)
		}
		return []string{stmt}, nil
	}
	table := stmt[m[4]:m[5]]
	e := engineRE.FindStringSubmatchIndex(stmt)
	if e == nil {
		return nil, fmt.Errorf("cannot make a replicated twin of %s: no *MergeTree engine", table)
	}
	engine, args := stmt[e[2]:e[3]], stmt[e[4]:e[5]]
	repl := fmt.Sprintf("ENGINE = Replicated%s('/clickhouse/tables/{shard}/%s/%s', '{replica}'", engine, database, table)
	if strings.TrimSpace(args) != "" {
		repl += ", " + args
	}
	repl += ")"
	local := stmt[:m[4]] + table + localSuffix + stmt[m[5]:e[0]] + repl + stmt[e[1]:]
	local, err := withColumns(local, table, later)
	if err != nil {
		return nil, err
	}
	dist := fmt.Sprintf("CREATE TABLE IF NOT EXISTS {db}.%s AS {db}.%s%s ENGINE = Distributed(%s, %s, %s%s)",
		table, table, localSuffix, cluster, database, table, localSuffix)
	return []string{local, dist}, nil
}

// laterColumns returns the columns migrations after version add, in order.
func laterColumns(version uint32) []addColumn {
	var out []addColumn
	for _, m := range migrations {
		if m.version > version {
			out = append(out, m.addColumns...)
		}
	}
	return out
}

// withColumns inserts into a CREATE TABLE statement of table the columns of add that
// belong to it, each after its column, as ALTER TABLE … ADD COLUMN … AFTER would. The
// statement lists one column per line, ending in ",", up to the line starting with ")".
func withColumns(stmt, table string, add []addColumn) (string, error) {
	open := strings.Index(stmt, "(\n")
	end := strings.Index(stmt, "\n\t\t) ENGINE")
	if end < 0 {
		end = strings.Index(stmt, "\n\t\t\t) ENGINE")
	}
	if open < 0 || end < open {
		return "", fmt.Errorf("cannot add later columns to %s: unexpected layout of its CREATE TABLE", table)
	}
	var cols []string
	for _, line := range strings.Split(stmt[open+2:end], "\n") {
		if line = strings.TrimSuffix(strings.TrimSpace(line), ","); line != "" {
			cols = append(cols, line)
		}
	}
	for _, c := range add {
		if c.table != table {
			continue
		}
		at := slices.IndexFunc(cols, func(col string) bool { return strings.Fields(col)[0] == c.after })
		if at < 0 {
			return "", fmt.Errorf("cannot add column %s.%s after %s: no such column", table, c.name, c.after)
		}
		cols = slices.Insert(cols, at+1, c.name+" "+c.typ)
	}
	return stmt[:open+2] + "\t\t\t" + strings.Join(cols, ",\n\t\t\t") + stmt[end:], nil
}

// ensureReplicatedColumn adds c on a replica: to table_local (a replicated ALTER, which
// reaches the other replicas through ZooKeeper), then to the Distributed table, whose
// columns are this server's own and must never outnumber the local table's (an insert
// would fail). Another replica's migration may add the same column at the same time, or
// have added it already with this replica not yet caught up: the ALTER then fails
// ("already exists", "metadata is not up to date"), and the column is waited for until
// this replica has it.
func ensureReplicatedColumn(ctx context.Context, conn driver.Conn, database string, c addColumn) error {
	local := c
	local.table += localSuffix
	deadline := time.Now().Add(replicatedAlterWait)
	for {
		has, err := hasColumn(ctx, conn, database, local)
		if err != nil {
			return err
		}
		if has {
			break
		}
		err = addColumnNow(ctx, conn, database, local)
		if err == nil {
			continue
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w (waited %v for the column to reach this replica)", err, replicatedAlterWait)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (then %w)", err, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
	return ensureColumn(ctx, conn, database, c)
}

// replicatedAlterWait bounds how long a replica's migration waits for a column another
// replica added: replication of an ALTER takes a few seconds at most on loopback.
const replicatedAlterWait = time.Minute

func appliedVersions(ctx context.Context, conn driver.Conn, database string) (map[uint32]bool, error) {
	rows, err := conn.Query(ctx, "SELECT DISTINCT version FROM "+database+".schema_migrations")
	if err != nil {
		return nil, fmt.Errorf("read %s.schema_migrations: %w", database, err)
	}
	defer rows.Close()
	applied := make(map[uint32]bool)
	for rows.Next() {
		var v uint32
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("read %s.schema_migrations: %w", database, err)
		}
		applied[v] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read %s.schema_migrations: %w", database, err)
	}
	return applied, nil
}

// recordVersion inserts through PrepareBatch: on 18.16 an INSERT ... VALUES sent
// through Exec hangs until the read timeout.
func recordVersion(ctx context.Context, conn driver.Conn, database string, version uint32) error {
	batch, err := conn.PrepareBatch(ctx, "INSERT INTO "+database+".schema_migrations (version, applied_at)")
	if err != nil {
		return fmt.Errorf("insert into %s.schema_migrations: prepare: %w", database, err)
	}
	if err := batch.Append(version, time.Now().UTC().Truncate(time.Second)); err != nil {
		_ = batch.Abort()
		return fmt.Errorf("insert into %s.schema_migrations: append: %w", database, err)
	}
	if err := batch.Send(); err != nil {
		return fmt.Errorf("insert into %s.schema_migrations: send: %w", database, err)
	}
	return nil
}

// ensureColumn adds c unless its table already has it (a migration that crashed half-way
// runs again). Another store migrating the same server at the same time may add it
// between the look and the ALTER, which then fails: the column being there is success.
func ensureColumn(ctx context.Context, conn driver.Conn, database string, c addColumn) error {
	has, err := hasColumn(ctx, conn, database, c)
	if err != nil || has {
		return err
	}
	err = addColumnNow(ctx, conn, database, c)
	if err == nil {
		return nil
	}
	if has, herr := hasColumn(ctx, conn, database, c); herr == nil && has {
		return nil
	}
	return err
}

// hasColumn reports whether c's table has c's column on this server.
func hasColumn(ctx context.Context, conn driver.Conn, database string, c addColumn) (bool, error) {
	var n uint64
	err := conn.QueryRow(ctx, "SELECT count() FROM system.columns WHERE database = ? AND table = ? AND name = ?",
		database, c.table, c.name).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("look up column %s.%s.%s: %w", database, c.table, c.name, err)
	}
	return n > 0, nil
}

// addColumnNow runs the ALTER that adds c.
func addColumnNow(ctx context.Context, conn driver.Conn, database string, c addColumn) error {
	stmt := fmt.Sprintf("ALTER TABLE %s.%s ADD COLUMN %s %s AFTER %s", database, c.table, c.name, c.typ, c.after)
	if err := conn.Exec(ctx, stmt); err != nil {
		return fmt.Errorf("add column %s.%s.%s: %w", database, c.table, c.name, err)
	}
	return nil
}
