package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/world"
)

const worldsUsage = `Usage:
  gauntlet worlds validate FILE...              check world files; every problem with its
                                                file, line and field
  gauntlet worlds describe FILE                 what a world declares: services, limits,
                                                state, tools and their rules, end conditions
  gauntlet worlds graph [--format text|dot] FILE
                                                the causal graph: the state each tool's
                                                rules read and the tools that change it
                                                (dot: pipe into Graphviz, e.g. dot -Tsvg)

A world file is a tool world written as YAML (docs/worlds.md). Serving processes load a
directory of them with --env.worlds DIR; 'gauntlet run --env.worlds DIR --env NAME' runs one.
`

// cmdWorlds is `gauntlet worlds`.
func cmdWorlds(_ context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, worldsUsage)
		return errUsage
	}
	switch args[0] {
	case "validate":
		return worldsValidate(args[1:], stdout, stderr)
	case "describe":
		return worldsDescribe(args[1:], stdout, stderr)
	case "graph":
		return worldsGraph(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, worldsUsage)
		return nil
	}
	fmt.Fprintf(stderr, "gauntlet worlds: unknown subcommand %q\n\n%s", args[0], worldsUsage)
	return errUsage
}

// errInvalidWorlds is returned when a file did not validate; the problems were printed.
var errInvalidWorlds = errors.New("invalid world files")

func worldsValidate(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("worlds validate", stderr)
	fs.Usage = func() { fmt.Fprint(stderr, worldsUsage) }
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fmt.Fprint(stderr, "gauntlet worlds validate: name at least one file\n\n"+worldsUsage)
		return errUsage
	}
	bad := 0
	for _, f := range fs.Args() {
		w, err := world.LoadFile(f)
		if err != nil {
			bad++
			fmt.Fprintln(stdout, err)
			continue
		}
		note := ""
		if e, err := env.Lookup(w.Name()); err == nil {
			if bw, ok := world.Of(e); !ok || bw.Digest() != w.Digest() {
				note = " (an env of that name is built in: --env.worlds would refuse it)"
			}
		}
		fmt.Fprintf(stdout, "%s: ok: world %s, %s%s\n", f, w.Name(), w.Digest(), note)
	}
	if bad > 0 {
		return fmt.Errorf("%d of %d: %w", bad, fs.NArg(), errInvalidWorlds)
	}
	return nil
}

func loadOne(name string, args []string, stderr io.Writer, format *string) (*world.World, error) {
	fs := newFlagSet("worlds "+name, stderr)
	fs.Usage = func() { fmt.Fprint(stderr, worldsUsage) }
	if format != nil {
		fs.StringVar(format, "format", "text", "text or dot")
	}
	if err := parse(fs, args); err != nil {
		return nil, err
	}
	if fs.NArg() != 1 {
		fmt.Fprintf(stderr, "gauntlet worlds %s: name one file\n\n%s", name, worldsUsage)
		return nil, errUsage
	}
	return world.LoadFile(fs.Arg(0))
}

func worldsDescribe(args []string, stdout, stderr io.Writer) error {
	w, err := loadOne("describe", args, stderr, nil)
	if err != nil {
		return err
	}
	return w.Describe(stdout)
}

func worldsGraph(args []string, stdout, stderr io.Writer) error {
	format := "text"
	w, err := loadOne("graph", args, stderr, &format)
	if err != nil {
		return err
	}
	switch format {
	case "text":
		return w.Graph().WriteText(stdout)
	case "dot":
		return w.Graph().WriteDOT(stdout)
	}
	fmt.Fprintf(stderr, "gauntlet worlds graph: --format %q: want text or dot\n", format)
	return errUsage
}
