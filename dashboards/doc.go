// Package dashboards holds gauntlet's Grafana dashboards (README.md says which is for
// what and how to import them). It has no Go code of its own; its test runs every
// ClickHouse panel's and variable's SQL, with the variables and the data source's
// macros expanded as Grafana expands them, against a real ClickHouse migrated to the
// current schema, so a dashboard cannot drift from the tables the store writes.
package dashboards
