package images

import (
	"crypto/sha256"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"github.com/opencontainers/go-digest"
)

// contextVersion starts every context digest; a change in what the digest covers
// changes it, so old cache entries are never taken for new ones.
const contextVersion = "gauntlet-build-context-v1\n"

// ContextDigest is the digest of a build context: every file, directory and symlink
// under dir (relative path, type, permission and setuid/setgid/sticky bits, the
// content of files, the target of links) in lexical order, plus the Dockerfile's path
// inside it. Modification times, owners and the directory's own location do not count,
// so a copied or re-checked-out context has the same digest, and any change a build
// could see gives another. Files a .dockerignore excludes count too: a change to
// them rebuilds, never the reverse. Other file types (devices, sockets, fifos) are
// refused: no Dockerfile COPY needs them.
func ContextDigest(dir, dockerfile string) (digest.Digest, error) {
	h := sha256.New()
	io.WriteString(h, contextVersion)
	io.WriteString(h, "dockerfile "+strconv.Quote(dockerfile)+"\n")
	buf := make([]byte, 64<<10)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		name := strconv.Quote(filepath.ToSlash(rel))
		info, err := d.Info()
		if err != nil {
			return err
		}
		mode := info.Mode()
		perm := strconv.FormatUint(uint64(mode.Perm()|mode&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)), 8)
		switch {
		case mode.IsDir():
			fmt.Fprintf(h, "d %s %s\n", perm, name)
		case mode&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "l %s %s\n", strconv.Quote(target), name)
		case mode.IsRegular():
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			fh := sha256.New()
			n, err := io.CopyBuffer(fh, f, buf)
			f.Close()
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "f %s %d %x %s\n", perm, n, fh.Sum(nil), name)
		default:
			return fmt.Errorf("%s: %w: a %s, not a file, directory or symlink", rel, ErrInvalid, mode.Type())
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("digest build context %s: %w", dir, err)
	}
	return digest.NewDigestFromBytes(digest.SHA256, h.Sum(nil)), nil
}
