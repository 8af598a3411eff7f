package envapi

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/runs"
)

// secretFile returns the secret kept in path, making it (size random bytes, in hex, mode
// 0600) only when the file is missing. An existing file is kept as long as valid accepts
// its text, so the secret survives restarts; one others may read is made private first.
// A file valid refuses is an error naming it: replacing it would lock out whoever holds
// the secret, and whatever wrote it should hear why.
func secretFile(path string, size int, valid func(string) error, log *slog.Logger) (string, error) {
	for range 2 {
		data, err := os.ReadFile(path)
		if err == nil {
			fi, err := os.Stat(path)
			if err != nil {
				return "", fmt.Errorf("%s: %w", path, err)
			}
			if fi.Mode().Perm()&0o077 != 0 {
				if err := os.Chmod(path, 0o600); err != nil {
					return "", fmt.Errorf("%s: others may read it and it cannot be made private: %w", path, err)
				}
				log.Warn("envapi: a secret file others could read is now mode 0600", "path", path, "was", fi.Mode().Perm().String())
			}
			s := strings.TrimSpace(string(data))
			if err := valid(s); err != nil {
				return "", fmt.Errorf("%s: %w (delete the file to have a new one made)", path, err)
			}
			return s, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("read %s: %w", path, err)
		}
		made, err := makeSecretFile(path, size)
		if err == nil {
			return made, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return "", err
		}
		// Another process made it meanwhile: read theirs.
	}
	return "", fmt.Errorf("%s: made and removed under us", path)
}

// makeSecretFile writes a new secret to path unless a file is there (fs.ErrExist): whole
// or not at all, written under a temporary name and linked into place.
func makeSecretFile(path string, size int) (string, error) {
	b := make([]byte, size)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("make %s: %w", path, err)
	}
	s := hex.EncodeToString(b)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", fmt.Errorf("make %s: %w", path, err)
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return "", fmt.Errorf("make %s: %w", path, err)
	}
	defer os.Remove(f.Name())
	_, err = f.WriteString(s + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Link(f.Name(), path) // CreateTemp made it 0600; Link fails if path exists
	}
	if err != nil {
		return "", fmt.Errorf("make %s: %w", path, err)
	}
	return s, nil
}

// validDevToken accepts what the tenants file accepts as a token: 16 or more characters,
// one word.
func validDevToken(s string) error {
	if len(s) < 16 {
		return fmt.Errorf("the token has %d characters, fewer than 16", len(s))
	}
	if strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return errors.New("the token must be one word of printable characters")
	}
	return nil
}

// episodeIDs issues the env API's episode ids and later tells which run of the API
// issued one. An id is runs.IssuedIDPrefix(run, time) (the run, "-v" and the time of
// issue in 16 hex digits), then 24 hex digits: the issuing run's boot number (4 bytes)
// and the first 8 bytes of an HMAC-SHA256 of all before it under a key kept in the data
// dir. The ids sort in issue order (the time never repeats or steps back within a run of
// the API, and servers share the clock they read), so the console pages a run's
// episodes by a range of the episodes table's key. After a restart an unknown id whose
// MAC checks out and whose boot number is not this run's was issued before the restart
// (its episode died with the old process), while a typo, an invented id or another
// tenant's fails the MAC and stays NOT_FOUND. Nothing is written per episode: no KV entry
// to write on the Reset path or to clean up, and the ids survive whatever happened to
// the old process. Ids of the earlier form ("<run>-", boot number, 8 random bytes, MAC,
// in 40 hex digits) are still told apart the same way.
type episodeIDs struct {
	key  []byte
	boot [4]byte
	now  func() time.Time
	// last is the time of the last id issued, in nanoseconds since 1970.
	last atomic.Uint64
}

const (
	idKeyBytes = 32
	oldHexLen  = 40 // the earlier form: boot 4 + random 8 + mac 8 bytes, in hex
	// issuedLen is an id's length past "<run>-": "v", the time, boot 4 + mac 8 bytes.
	issuedLen = 1 + runs.IssuedTimeDigits + 24
)

// newEpisodeIDs issues ids under key in a run with a fresh random boot number.
func newEpisodeIDs(key []byte) *episodeIDs {
	g := &episodeIDs{key: key, now: time.Now}
	for g.boot == [4]byte{} {
		_, _ = rand.Read(g.boot[:])
	}
	return g
}

// loadEpisodeIDs reads the id key at path, making it on first use.
func loadEpisodeIDs(path string, log *slog.Logger) (*episodeIDs, error) {
	s, err := secretFile(path, idKeyBytes, func(s string) error {
		if b, err := hex.DecodeString(s); err != nil || len(b) != idKeyBytes {
			return fmt.Errorf("want %d hex digits", 2*idKeyBytes)
		}
		return nil
	}, log)
	if err != nil {
		return nil, fmt.Errorf("episode id key: %w", err)
	}
	key, _ := hex.DecodeString(s)
	return newEpisodeIDs(key), nil
}

// issue returns a new episode id of run, issued at the clock's time or, when the clock
// has not moved past the last id's time (or stepped back), a nanosecond after it.
func (g *episodeIDs) issue(run string) string {
	var at uint64
	for {
		last := g.last.Load()
		at = max(uint64(g.now().UnixNano()), last+1)
		if g.last.CompareAndSwap(last, at) {
			break
		}
	}
	id := make([]byte, 0, len(run)+1+issuedLen)
	id = append(id, runs.IssuedIDPrefix(run, at)...)
	id = hex.AppendEncode(id, g.boot[:])
	return string(hex.AppendEncode(id, g.mac(id)))
}

// mac is the first 8 bytes of the HMAC of an id's unsigned part.
func (g *episodeIDs) mac(unsigned []byte) []byte {
	h := hmac.New(sha256.New, g.key)
	h.Write(unsigned)
	return h.Sum(nil)[:8]
}

// issuedBefore reports whether id is one of run's, issued by an earlier run of the API
// under the same key: one whose episode the restart ended.
func (g *episodeIDs) issuedBefore(run, id string) bool {
	if g == nil || !strings.HasPrefix(id, run+"-") {
		return false
	}
	rest := id[len(run)+1:]
	var boot []byte
	switch {
	case len(rest) == issuedLen && rest[0] == 'v':
		if _, ok := runs.IssuedAt(run, id); !ok {
			return false
		}
		boot = []byte(rest[1+runs.IssuedTimeDigits : 1+runs.IssuedTimeDigits+8])
	case len(rest) == oldHexLen:
		boot = []byte(rest[:8])
	default:
		return false
	}
	b, err := hex.DecodeString(string(boot))
	if err != nil {
		return false
	}
	sum, err := hex.DecodeString(id[len(id)-16:])
	if err != nil {
		return false
	}
	unsigned := []byte(id[:len(id)-16])
	return hmac.Equal(sum, g.mac(unsigned)) && [4]byte(b) != g.boot
}
