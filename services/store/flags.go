package store

import (
	"flag"
	"time"
)

// RegisterFlags declares the store.* flags on fs with their defaults. Addr and Database
// come from the process (--clickhouse, --clickhouse.database), which shares them with
// other modules.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.IntVar(&c.BatchRows, "store.batch-rows", 25_000, "most step and episode rows per ClickHouse insert")
	fs.DurationVar(&c.FlushEvery, "store.flush-every", 5*time.Second, "longest wait of an event in a partial batch")
	fs.DurationVar(&c.IdleFlush, "store.idle-flush", 250*time.Millisecond, "write a partial batch once no event arrived for this long (0: never)")
	fs.DurationVar(&c.AckWait, "store.ack-wait", 30*time.Second, "lease on delivered events (renewed while ClickHouse is down)")
}
