// Package chtest starts a throwaway local ClickHouse for tests of other packages.
//
// Tests that need ClickHouse call [Start] and get a running server with its data in
// the test's temporary directory; cleanup kills it when the test ends. A machine
// without ClickHouse fails the test with the reason (run scripts/deps.sh), never
// skips it: a skipped database test is a test that silently stopped testing.
package chtest
