// Package tasks reads task folders in the Harbor / Terminal-Bench format, strictly, and
// datasets of them.
//
// A task is a folder holding instruction.md (what the agent is told), task.toml (schema
// version, metadata, the agent's and the verifier's timeouts and environment, the
// environment's build timeout and resources), environment/ (a Dockerfile and its build
// context, or [environment].docker_image naming a prebuilt image), tests/test.sh (the
// verifier, which writes /logs/verifier/reward.txt or reward.json) and, optionally,
// solution/solve.sh (the reference solution the oracle runs). The format is Harbor's, as
// its documentation describes it (docs/tasks.md cites the pages); Load accepts what that
// format allows and refuses the rest: an unknown key of task.toml, a key of the wrong type,
// a timeout that is not a finite positive number of seconds, a missing instruction or
// test.sh, an environment with neither a Dockerfile nor an image. Every problem of a task
// is reported at once, each as a *FieldError naming the task and the field.
//
// [metadata] is free-form in Harbor's format, so its keys are kept as they are (Metadata.
// Extra); only the keys gauntlet interprets (difficulty, category, tags, authors) are
// typed and checked.
//
// A dataset (LoadDataset) is a folder searched recursively for task folders (a folder with
// task.toml is a task and is not searched further), or a Harbor registry-style JSON
// manifest listing task folders by path. Loading a dataset reads every task and joins every
// task's errors, so one run of `gauntlet tasks validate` lists all of them.
//
// Each task has a content digest (Digest) over every file of its folder: the paths sorted,
// each entry's kind, permission bits and content. A task that changes in any byte the
// agent, the verifier or the image build could see gets a new digest, so a recorded episode
// is never attributed to a changed task.
//
// Everything here is pure reading of the file system: no images are built and nothing is
// run. Values are immutable once returned and safe to share between goroutines.
package tasks
