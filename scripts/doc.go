// Package scripts holds the project's shell scripts (deps.sh, gotest.sh and the local
// servers' helpers) and, in its tests, the checks of what those scripts promise.
package scripts
