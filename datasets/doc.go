// Package datasets holds gauntlet's own task datasets, in Harbor's task folder format
// (docs/tasks.md): datasets/gauntlet is a folder of task folders (codefix's built-in bugs,
// generated from pkg/env/codefix, and hand-written shell, data and Python tasks). It has no
// Go code of its own; its test validates every task and checks, on the host, that each
// oracle solution passes its verifier and that doing nothing fails it.
package datasets
