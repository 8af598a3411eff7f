// Package report builds gauntlet's compatibility report of runs or of a curriculum:
// success with Wilson intervals, reward and step percentiles, how the agent does under
// each fault kind, safety triggers and broken causal rules, cost and metering, stuck and
// looping episodes, and, for a curriculum, each stage. It renders the report as a
// terminal table, JSON, or one self-contained HTML file with inline SVG charts.
//
// Every number is the result of one of Queries (or Wilson's interval over its counts);
// docs/querying.md shows the same SQL, and a test holds the two equal and checks the
// report against the SQL on a real run. Build only reads; it is safe to call
// concurrently with a connection that is.
package report
