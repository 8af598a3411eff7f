package report

// Query is one SQL statement of the report. Its text is also in docs/querying.md, under
// a line "<!-- report:NAME -->", with {db} written as gauntlet; a test holds the two
// equal and checks the report's numbers against the query run on a real run. {runs}
// stands for the runs' ids, quoted and separated by commas; {first} and {last} for the
// first and last requested_at of their episodes (Unix seconds, from the overview), which
// bound the day partitions the steps and faults queries read: those tables are keyed by
// episode, not by run.
type Query struct {
	Name string
	SQL  string
}

// The report's queries. Rates and intervals exclude infra errors (an episode gauntlet
// failed to run says nothing about the agent); the overview counts them apart.
var (
	// qOverview: counts, mean and percentiles of reward and steps, and stuck episodes.
	qOverview = Query{"overview", `SELECT count() AS episodes,
       countIf(infra_error = 1) AS infra_errors,
       countIf(infra_error = 0) AS scored,
       countIf(infra_error = 0 AND success = 1) AS succeeded,
       avgIf(total_reward, infra_error = 0) AS reward_mean,
       quantilesExactIf(0.5, 0.9, 0.99)(total_reward, infra_error = 0) AS reward_p50_p90_p99,
       quantilesExactIf(0.5, 0.9, 0.99)(toFloat64(steps), infra_error = 0) AS steps_p50_p90_p99,
       countIf(infra_error = 0 AND success = 0 AND truncated = 1) AS stuck,
       toUInt32(min(requested_at)) AS first,
       toUInt32(max(requested_at)) AS last
FROM {db}.episodes FINAL
WHERE run_id IN ({runs})`}

	// qByRun: the same per run, for A/B comparisons (by seed, policy mix, build).
	qByRun = Query{"by_run", `SELECT run_id,
       count() AS episodes,
       countIf(infra_error = 0) AS scored,
       countIf(infra_error = 0 AND success = 1) AS succeeded,
       avgIf(total_reward, infra_error = 0) AS reward_mean,
       quantilesExactIf(0.5, 0.9, 0.99)(total_reward, infra_error = 0) AS reward_p50_p90_p99
FROM {db}.episodes FINAL
WHERE run_id IN ({runs})
GROUP BY run_id
ORDER BY run_id`}

	// qByPolicy: per policy.
	qByPolicy = Query{"by_policy", `SELECT policy,
       count() AS episodes,
       countIf(infra_error = 0) AS scored,
       countIf(infra_error = 0 AND success = 1) AS succeeded,
       avgIf(total_reward, infra_error = 0) AS reward_mean
FROM {db}.episodes FINAL
WHERE run_id IN ({runs})
GROUP BY policy
ORDER BY policy`}

	// qFaultMet: per fault kind, the episodes that met it at least once.
	qFaultMet = Query{"fault_met", `SELECT kind,
       count() AS episodes,
       sum(success) AS succeeded,
       avg(total_reward) AS reward_mean
FROM (SELECT DISTINCT episode_id, kind FROM {db}.faults FINAL WHERE run_id IN ({runs}) AND requested_at BETWEEN toDateTime({first}) AND toDateTime({last}))
ALL INNER JOIN
     (SELECT episode_id, success, total_reward FROM {db}.episodes FINAL
      WHERE run_id IN ({runs}) AND infra_error = 0)
USING episode_id
GROUP BY kind
ORDER BY kind`}

	// qFaultFirst: the first-fault cut: each faulted episode counted once, under the kind
	// of the first fault it met (lowest step, then order within the step).
	qFaultFirst = Query{"fault_first", `SELECT kind,
       count() AS episodes,
       sum(success) AS succeeded,
       avg(total_reward) AS reward_mean
FROM (SELECT episode_id, argMin(kind, step * 65536 + seq) AS kind FROM {db}.faults FINAL
      WHERE run_id IN ({runs}) AND requested_at BETWEEN toDateTime({first}) AND toDateTime({last}) GROUP BY episode_id)
ALL INNER JOIN
     (SELECT episode_id, success, total_reward FROM {db}.episodes FINAL
      WHERE run_id IN ({runs}) AND infra_error = 0)
USING episode_id
GROUP BY kind
ORDER BY kind`}

	// qUnfaulted: the baseline: episodes no fault touched.
	qUnfaulted = Query{"unfaulted", `SELECT count() AS episodes,
       sum(success) AS succeeded,
       avg(total_reward) AS reward_mean
FROM {db}.episodes FINAL
WHERE run_id IN ({runs}) AND infra_error = 0 AND faults_fired = 0`}

	// qSafety: safety events the sandbox or env recorded, and what the steps they
	// happened in scored.
	qSafety = Query{"safety", `SELECT event,
       count() AS times,
       uniqExact(episode_id) AS episodes,
       avg(r_safety) AS safety_mean,
       avg(reward) AS step_reward_mean
FROM {db}.steps FINAL
ARRAY JOIN safety_events AS event
WHERE run_id IN ({runs}) AND requested_at BETWEEN toDateTime({first}) AND toDateTime({last})
GROUP BY event
ORDER BY times DESC, event`}

	// qLimits: the resource limits the sandboxes hit (steps.limits, "KIND: DETAIL"), by
	// kind, apart from the safety events: honest programs meet them too. Per kind, how
	// often it was hit, the scored episodes that hit it (and how many of them succeeded),
	// those whose last step hit it, and what those episodes and steps scored.
	qLimits = Query{"limits", `SELECT kind,
       sum(hits) AS times,
       count() AS episodes,
       sum(success) AS succeeded,
       sum(ended_on) AS ended,
       avg(total_reward) AS reward_mean,
       sum(hit_rewards) / sum(hits) AS step_reward_mean
FROM (SELECT episode_id, extract(hit, '^[^:]*') AS kind, count() AS hits, max(terminated OR truncated) AS ended_on, sum(reward) AS hit_rewards
      FROM {db}.steps FINAL
      ARRAY JOIN limits AS hit
      WHERE run_id IN ({runs}) AND requested_at BETWEEN toDateTime({first}) AND toDateTime({last})
      GROUP BY episode_id, kind)
ALL INNER JOIN
     (SELECT episode_id, success, total_reward FROM {db}.episodes FINAL
      WHERE run_id IN ({runs}) AND infra_error = 0)
USING episode_id
GROUP BY kind
ORDER BY episodes DESC, kind`}

	// qViolations: causal rules the agent broke, and what the steps scored.
	qViolations = Query{"violations", `SELECT rule,
       count() AS times,
       uniqExact(episode_id) AS episodes,
       avg(r_causal) AS causal_mean,
       avg(reward) AS step_reward_mean
FROM {db}.steps FINAL
ARRAY JOIN violation_rules AS rule
WHERE run_id IN ({runs}) AND requested_at BETWEEN toDateTime({first}) AND toDateTime({last})
GROUP BY rule
ORDER BY times DESC, rule`}

	// qCost: cost and metering over every step.
	qCost = Query{"cost", `SELECT count() AS steps,
       sum(spend) AS spend,
       sum(tool_calls) AS tool_calls,
       sum(errors) AS errors,
       sum(invalid_action) AS invalid_actions,
       sum(bytes_in) AS bytes_in,
       sum(bytes_out) AS bytes_out,
       sum(cpu_ns) AS cpu_ns,
       max(peak_memory_bytes) AS peak_memory_bytes,
       sum(wall_ns) AS wall_ns,
       sum(virtual_ns) AS virtual_ns,
       avg(reward) AS step_reward_mean
FROM {db}.steps FINAL
WHERE run_id IN ({runs}) AND requested_at BETWEEN toDateTime({first}) AND toDateTime({last})`}

	// qLatency: where a step's time goes: the env, the policy, the scoring, and their
	// sum (exact percentiles, in nanoseconds). Steps recorded before these were
	// measured have 0 for the policy and the scoring.
	qLatency = Query{"latency", `SELECT quantilesExact(0.5, 0.9, 0.99)(toFloat64(wall_ns)) AS env_p50_p90_p99,
       quantilesExact(0.5, 0.9, 0.99)(toFloat64(policy_ns)) AS policy_p50_p90_p99,
       quantilesExact(0.5, 0.9, 0.99)(toFloat64(reward_ns)) AS reward_p50_p90_p99,
       quantilesExact(0.5, 0.9, 0.99)(toFloat64(wall_ns + policy_ns + reward_ns)) AS step_p50_p90_p99
FROM {db}.steps FINAL
WHERE run_id IN ({runs}) AND requested_at BETWEEN toDateTime({first}) AND toDateTime({last})`}

	// qStuck: stuck episodes (ran out of steps or time without succeeding), by reason.
	qStuck = Query{"stuck", `SELECT reason, count() AS episodes
FROM {db}.episodes FINAL
WHERE run_id IN ({runs}) AND infra_error = 0 AND success = 0 AND truncated = 1
GROUP BY reason
ORDER BY episodes DESC, reason`}

	// qLooping: looping episodes: one action (the same tool with the same arguments)
	// taken at least 5 times and in at least half of the episode's steps.
	qLooping = Query{"looping", `SELECT count() AS episodes,
       sum(success) AS succeeded
FROM (SELECT episode_id, max(n) AS top, sum(n) AS total
      FROM (SELECT episode_id, tool, cityHash64(args) AS action, count() AS n FROM {db}.steps FINAL
            WHERE run_id IN ({runs}) AND requested_at BETWEEN toDateTime({first}) AND toDateTime({last}) GROUP BY episode_id, tool, action)
      GROUP BY episode_id
      HAVING top >= 5 AND top * 2 >= total)
ALL INNER JOIN
     (SELECT episode_id, success FROM {db}.episodes FINAL WHERE run_id IN ({runs}) AND infra_error = 0)
USING episode_id`}

	// qLoopingTop: the worst looping episodes and the action they repeat.
	qLoopingTop = Query{"looping_top", `SELECT episode_id, argMax(tool, n) AS tool, max(n) AS repeats, sum(n) AS steps
FROM (SELECT episode_id, tool, cityHash64(args) AS action, count() AS n FROM {db}.steps FINAL
      WHERE run_id IN ({runs}) AND requested_at BETWEEN toDateTime({first}) AND toDateTime({last}) GROUP BY episode_id, tool, action)
GROUP BY episode_id
HAVING repeats >= 5 AND repeats * 2 >= steps
ORDER BY repeats DESC, episode_id
LIMIT 10`}

	// qByStage: a curriculum's episodes per stage (runs carry their stage).
	qByStage = Query{"by_stage", `SELECT stage,
       any(stage_name) AS stage_name,
       count() AS episodes,
       countIf(infra_error = 0) AS scored,
       countIf(infra_error = 0 AND success = 1) AS succeeded,
       avgIf(total_reward, infra_error = 0) AS reward_mean
FROM {db}.episodes FINAL
ALL INNER JOIN
     (SELECT run_id, stage, stage_name FROM {db}.runs FINAL WHERE run_id IN ({runs}))
USING run_id
WHERE run_id IN ({runs})
GROUP BY stage
ORDER BY stage`}
)

// Queries lists every query of the report, in the order docs/querying.md shows them.
var Queries = []Query{qOverview, qByRun, qByPolicy, qFaultMet, qFaultFirst, qUnfaulted, qSafety, qLimits, qViolations,
	qCost, qLatency, qStuck, qLooping, qLoopingTop, qByStage}
