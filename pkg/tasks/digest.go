package tasks

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
)

// digestHeader starts every digest's input, so a change to what the digest covers (a new
// version here) never collides with digests made the old way.
const digestHeader = "gauntlet task digest v1\n"

// Digest is the content digest of the task folder dir, "sha256:" and 64 hex digits.
//
// It covers every regular file and symlink under dir, hidden ones included, sorted by
// their slash-separated path relative to dir (byte order). For each it hashes the kind
// ("f" a file, "x" a file with any execute bit, "l" a symlink), the path, and the content
// (a symlink's target, unresolved), each length-prefixed so no two folders give one input.
// Only the execute bit of a mode counts, as in git, so a checkout under another umask has
// the same digest; owners, times and empty folders do not count. A device, socket or pipe
// in the folder is an error: it cannot be copied into a sandbox.
func Digest(dir string) (string, error) {
	type entry struct {
		rel  string
		kind byte
	}
	var entries []entry
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == dir {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		switch t := d.Type(); {
		case t.IsDir():
			return nil
		case t&fs.ModeSymlink != 0:
			entries = append(entries, entry{rel, 'l'})
		case t.IsRegular():
			fi, err := d.Info()
			if err != nil {
				return err
			}
			kind := byte('f')
			if fi.Mode().Perm()&0o111 != 0 {
				kind = 'x'
			}
			entries = append(entries, entry{rel, kind})
		default:
			return fmt.Errorf("%s: %s files cannot be part of a task", rel, t)
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("digest task folder %s: %w", dir, err)
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].rel < entries[j].rel })

	h := sha256.New()
	io.WriteString(h, digestHeader)
	field := func(b []byte) {
		io.WriteString(h, strconv.Itoa(len(b)))
		h.Write([]byte{':'})
		h.Write(b)
	}
	for _, e := range entries {
		p := filepath.Join(dir, filepath.FromSlash(e.rel))
		h.Write([]byte{e.kind})
		field([]byte(e.rel))
		if e.kind == 'l' {
			target, err := os.Readlink(p)
			if err != nil {
				return "", fmt.Errorf("digest task folder %s: %w", dir, err)
			}
			field([]byte(target))
			continue
		}
		if err := hashFile(h, p); err != nil {
			return "", fmt.Errorf("digest task folder %s: %w", dir, err)
		}
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// hashFile writes the file's length-prefixed content to h without holding it in memory.
func hashFile(h io.Writer, p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	io.WriteString(h, strconv.FormatInt(fi.Size(), 10))
	h.Write([]byte{':'})
	n, err := io.Copy(h, f)
	if err != nil {
		return err
	}
	if n != fi.Size() {
		return fmt.Errorf("%s changed while it was read", p)
	}
	return nil
}
