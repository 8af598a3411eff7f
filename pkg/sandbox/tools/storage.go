package tools

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"syscall"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
)

// Storage faults. With Options.Storage set, every file operation of the fs tools
// is first an event of that faultfs.Gate, named like faultfs names it (op and the path
// relative to the workspace root, stream key "fs/<path>"), so the same actions meet the
// same faults on every runtime and in a replay:
//
//	fs.read   open, read
//	fs.write  create (when the file does not exist yet), open, write
//	fs.list   open (the directory)
//	fs.patch  the events of fs.read, then those of fs.write
//
// An abort fails the call before it touches the workspace, with the errno the kernel would
// give ("fs.write: write notes.txt: no space left on device"); a short write stores only
// part of the content and fails with io.ErrShortWrite; delays are spent by the gate's
// wait. These are the agent's errors (AgentError), shown as observations. A path the tools
// refuse (symlink, special file) skips the gate: the refusal and its safety event come
// first. Commands run by shell.exec do not pass through the gate.

// storageFault marks an error a storage fault injected, so AgentError treats it as the
// agent's to handle.
type storageFault struct{ err error }

func (s storageFault) Error() string { return s.err.Error() }
func (s storageFault) Unwrap() error { return s.err }

// InjectedFault reports whether err is a storage fault the Gate injected (as opposed to a
// real error of the workspace).
func InjectedFault(err error) bool {
	var sf storageFault
	return errors.As(err, &sf)
}

// gate runs op on rel through Options.Storage; the decision is the zero-fault one without
// it.
func (t *Toolbox) gate(ctx context.Context, tool, op, rel string) (catalogue.Decision, error) {
	if t.opts.Storage == nil {
		return catalogue.Decision{Keep: 1, WriteKeep: 1}, nil
	}
	dec, err := t.opts.Storage.Before(ctx, op, rel)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			return dec, fmt.Errorf("%s: %w", tool, storageFault{err})
		}
		return dec, fmt.Errorf("%s %s: %w", tool, rel, err) // the context ended while waiting
	}
	return dec, nil
}

// probe looks rel up through its parent's listing before the gate: whether it exists,
// and whether the backend will refuse it (a symlink or special file on the path or at its
// end, a path leaving the workspace). A refused path skips the gate, so the refusal is
// what the agent meets and what is recorded as a safety event, never hidden behind
// an injected fault.
func (t *Toolbox) probe(ctx context.Context, rel string) (exists, refused bool) {
	if rel == "." {
		return true, false
	}
	dir, base := path.Split(rel)
	if dir == "" {
		dir = "."
	}
	es, err := t.fs.list(ctx, path.Clean(dir))
	switch {
	case errors.Is(err, ErrSymlink), errors.Is(err, ErrOutside), errors.Is(err, ErrSpecialFile):
		return false, true
	case err != nil:
		return false, false
	}
	for _, e := range es {
		if e.Name == base {
			return true, e.Type == "symlink" || e.Type == "other"
		}
	}
	return false, false
}

// gateList passes fs.list's event.
func (t *Toolbox) gateList(ctx context.Context, tool, rel string) error {
	if t.opts.Storage == nil {
		return nil
	}
	if _, refused := t.probe(ctx, rel); refused {
		return nil
	}
	_, err := t.gate(ctx, tool, catalogue.OpOpen, rel)
	return err
}

// gateRead passes fs.read's events.
func (t *Toolbox) gateRead(ctx context.Context, tool, rel string) error {
	if t.opts.Storage == nil {
		return nil
	}
	if _, refused := t.probe(ctx, rel); refused {
		return nil
	}
	if _, err := t.gate(ctx, tool, catalogue.OpOpen, rel); err != nil {
		return err
	}
	_, err := t.gate(ctx, tool, catalogue.OpRead, rel)
	return err
}

// gateWrite passes fs.write's events and returns how many bytes of n the write stores
// (n unless a short write fired) with the error a short write ends in.
func (t *Toolbox) gateWrite(ctx context.Context, tool, rel string, n int) (int, error) {
	if t.opts.Storage == nil {
		return n, nil
	}
	exists, refused := t.probe(ctx, rel)
	if refused {
		return n, nil
	}
	if !exists {
		if _, err := t.gate(ctx, tool, catalogue.OpCreate, rel); err != nil {
			return 0, err
		}
	}
	if _, err := t.gate(ctx, tool, catalogue.OpOpen, rel); err != nil {
		return 0, err
	}
	dec, err := t.gate(ctx, tool, catalogue.OpWrite, rel)
	if err != nil {
		return 0, err
	}
	if dec.WriteKeep < 1 {
		k := int(float64(n) * dec.WriteKeep)
		return k, fmt.Errorf("%s: %w", tool, storageFault{&fs.PathError{Op: "write", Path: rel, Err: io.ErrShortWrite}})
	}
	return n, nil
}

// diskFull reports whether err is the workspace's filesystem being full for real (a
// size-limited tmpfs, a quota): the agent filled it, so it is the agent's error too.
func diskFull(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}
