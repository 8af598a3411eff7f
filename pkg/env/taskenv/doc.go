// Package taskenv is the "tasks" env: the tasks of a Harbor-format dataset (package tasks)
// played as episodes through the one episode runner, so workers, the env API, curricula,
// replay and forks play task folders as they play shop and codefix.
//
// An episode names its dataset and task in its params ({"dataset": NAME, "task": ID}, NAME
// one of the process's --tasks.datasets, see Config; a "digest" given must match the
// task's current content digest). A task left out is picked by the seed, modulo their
// count, among a selection (select.go): the tasks the params pin by ID and digest, as
// `gauntlet run --tasks` and curriculum stages write them, else those their tags,
// difficulty and glob filters select, else all the dataset's tasks, in ID order. Reset acquires a sandbox
// whose workspace holds the task's environment/app folder, shown at /app as the task's
// Dockerfile would COPY it, with /logs, /tests and /solution linked into the workspace
// (sandbox.Spec.Links), and returns the instruction with the task's ID and digest, so a
// recorded episode names exactly the task content it played. The agent has the workspace
// tools of package tools and submit, under the task's [agent] timeout (the episode's
// virtual deadline, and the wall-time bound of each command) and [environment] limits.
//
// When the agent submits, or runs out of steps or time, the verifier judges the final
// state outside the agent's reach (verify.go): the agent's sandbox is snapshotted and a
// fresh fork of the snapshot is made, where no process of the agent runs; there /logs is
// rebuilt empty, tests/ is copied in (the agent never saw it), and tests/test.sh runs under
// the [verifier] timeout. reward.txt or reward.json become the episode's named rewards, in
// the last step's observation; a verifier that times out or writes no valid reward is an
// infra error naming the reason, never a reward of 0. What the agent planted for the
// verifier (a reward file, a tests/ folder, a link in place of /logs) is removed before it
// runs and recorded as a safety event.
//
// On the process runtime a task's environment is the host's system plus the workspace:
// the task's image is not built or unpacked, so a Dockerfile that installs tools needs
// them on the host (as package taskstest says). The containerd runtime refuses Links.
package taskenv
