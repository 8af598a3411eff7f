package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"go.temporal.io/sdk/client"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
)

// dataDirEnv names the environment variable that gives --data-dir its default, so a
// shell (or a container image) set up once finds its stack without repeating the flag.
const dataDirEnv = "GAUNTLET_DATA"

// defaultDataDir is --data-dir's default when dataDirEnv is unset.
const defaultDataDir = ".gauntlet"

// registerDataDir declares --data-dir, defaulting to $GAUNTLET_DATA, else .gauntlet.
func registerDataDir(fs *flag.FlagSet, p *string, usage string) {
	def := os.Getenv(dataDirEnv)
	if def == "" {
		def = defaultDataDir
	}
	fs.StringVar(p, "data-dir", def, usage+" ($"+dataDirEnv+" sets the default)")
}

// stackParts are the parts of a stack a client command talks to; it gets the flags of
// those and no others, so no flag it shows is ignored.
type stackParts uint8

const (
	partNATS       stackParts = 1 << iota // --nats
	partClickHouse                        // --clickhouse, --database
	partTemporal                          // --temporal, --namespace
)

// stackFlags are how every client command finds a running stack: the flags name its parts
// directly, or stack.json, which `gauntlet up` writes into --data-dir, says where they
// are. stack.json is read once, and only when a part the command needs is not named.
type stackFlags struct {
	dataDir    string
	nats       string
	clickHouse string
	database   string
	temporal   string
	namespace  string

	read  bool
	st    stack
	stErr error
}

// register declares --data-dir and the flags of parts on fs.
func (f *stackFlags) register(fs *flag.FlagSet, parts stackParts) {
	registerDataDir(fs, &f.dataDir, "where `gauntlet up` left stack.json")
	if parts&partNATS != 0 {
		fs.StringVar(&f.nats, "nats", "", "NATS URL (default: from stack.json)")
	}
	if parts&partClickHouse != 0 {
		fs.StringVar(&f.clickHouse, "clickhouse", "", "ClickHouse native address, or the replicas' comma-separated (default: from stack.json)")
		fs.StringVar(&f.database, "database", "", "ClickHouse database (default: from stack.json, else gauntlet)")
	}
	if parts&partTemporal != 0 {
		fs.StringVar(&f.temporal, "temporal", "", "Temporal frontend host:port (default: from stack.json)")
		fs.StringVar(&f.namespace, "namespace", "default", "Temporal namespace")
	}
}

// stack returns the running stack's stack.json.
func (f *stackFlags) stack() (stack, error) {
	if !f.read {
		f.st, f.stErr = readStack(f.dataDir)
		f.read = true
	}
	return f.st, f.stErr
}

// datasets are the task datasets the stack's episodes may play, by name, as its
// stack.json says.
func (f *stackFlags) datasets() (map[string]string, error) {
	st, err := f.stack()
	return st.Datasets, err
}

// natsURL is the NATS of the stack.
func (f *stackFlags) natsURL() (string, error) {
	if f.nats != "" {
		return f.nats, nil
	}
	st, err := f.stack()
	if err != nil {
		return "", err
	}
	return st.NATSURL, nil
}

// connectBus connects to the stack's NATS as name, logging warnings to stderr.
func (f *stackFlags) connectBus(name string, stderr io.Writer) (*bus.Bus, error) {
	url, err := f.natsURL()
	if err != nil {
		return nil, err
	}
	log, _ := newLogger("warn", stderr)
	return bus.Connect(url, name, log)
}

// clickHouseIfKnown is the stack's ClickHouse address ("" when neither --clickhouse nor a
// stack.json names one) and database.
func (f *stackFlags) clickHouseIfKnown() (addr, db string) {
	addr, db = f.clickHouse, f.database
	if addr == "" || db == "" {
		st, _ := f.stack()
		addr, db = cmp.Or(addr, st.ClickHouse), cmp.Or(db, st.Database)
	}
	return addr, cmp.Or(db, "gauntlet")
}

// connectClickHouse connects to the stack's ClickHouse and returns its database.
func (f *stackFlags) connectClickHouse(ctx context.Context) (driver.Conn, string, error) {
	if f.clickHouse == "" {
		if _, err := f.stack(); err != nil {
			return nil, "", err
		}
	}
	addr, db := f.clickHouseIfKnown()
	conn, err := trajectory.Connect(ctx, addr, db)
	return conn, db, err
}

// dialTemporal connects to the stack's Temporal frontend.
func (f *stackFlags) dialTemporal(ctx context.Context) (client.Client, error) {
	addr := f.temporal
	if addr == "" {
		st, err := f.stack()
		if err != nil {
			return nil, err
		}
		if st.Temporal == "" {
			return nil, errors.New("the running stack has no Temporal (started without the curriculum module?); pass --temporal HOST:PORT")
		}
		addr = st.Temporal
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	log, _ := newLogger("error", io.Discard)
	c, err := client.DialContext(dctx, client.Options{HostPort: addr, Namespace: f.namespace, Logger: sdkLogger{log}})
	if err != nil {
		return nil, fmt.Errorf("connect to temporal at %s: %w", addr, err)
	}
	return c, nil
}
