package sandbox

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
)

// CopyTree copies the tree src of from into dst of to: folders, regular files and
// symlinks (copied as links, never followed), each chmod'ed to its mode masked by keep
// and chowned as owner says; devices, fifos and sockets are no part of a workspace and
// are skipped. from and to may be the same root; dst must not hold what it copies. Both
// sides are reached through os.Root, so no link in either leads the copy out of them.
func CopyTree(from *os.Root, src string, to *os.Root, dst string, keep fs.FileMode, owner func(fs.FileInfo) (uid, gid int)) error {
	return fs.WalkDir(from.FS(), src, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		target := path.Join(dst, strings.TrimPrefix(strings.TrimPrefix(p, src), "/"))
		fi, err := from.Lstat(p)
		if err != nil {
			return err
		}
		mode := fi.Mode()
		switch {
		case mode.IsDir():
			if err := to.MkdirAll(target, 0o700); err != nil {
				return err
			}
		case mode&fs.ModeSymlink != 0:
			link, err := from.Readlink(p)
			if err != nil {
				return err
			}
			if err := to.Symlink(link, target); err != nil {
				return err
			}
		case mode.IsRegular():
			if err := copyFile(from, p, to, target); err != nil {
				return err
			}
		default:
			return nil
		}
		uid, gid := owner(fi)
		if err := to.Lchown(target, uid, gid); err != nil {
			return err
		}
		if mode&fs.ModeSymlink == 0 {
			return to.Chmod(target, mode&keep)
		}
		return nil
	})
}

func copyFile(from *os.Root, src string, to *os.Root, dst string) error {
	in, err := from.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := to.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", src, err)
	}
	return out.Close()
}
