package images

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/pkg/archive"
	"github.com/containerd/containerd/v2/pkg/archive/compression"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Unpack returns a directory holding img's root filesystem, for the process runtime
// to mount read-only as the lowest layer of a sandbox's overlay. It needs no
// containerd: the image's manifest, config and layers (for this host's platform) are
// fetched from the registry img.Ref names, with the docker config's credentials, into
// a content store under CacheDir/content (blobs already there are not fetched again),
// and the layers applied in order, whiteouts included, with each one's uncompressed
// digest checked against the image config's diff ids. The result is cached under
// CacheDir/rootfs/<digest>: an image already unpacked costs a stat when img.Digest is
// set (as Build sets it), else one registry round trip to resolve img.Ref first. The directory is shared by
// every caller and must never be written to: mount it only as an overlay lower layer
// (or bind it read-only). Files keep the owners the image gives them, so unpacking
// needs root.
func (s *Store) Unpack(ctx context.Context, img Image) (string, error) {
	ctx = quiet(ctx)
	ref, err := normalize(img.Ref)
	if err != nil {
		return "", fmt.Errorf("unpack image: %w", err)
	}
	// An image of known digest already unpacked needs no registry at all.
	if img.Digest != "" {
		if err := img.Digest.Validate(); err != nil {
			return "", fmt.Errorf("unpack image %s: %w: digest: %v", ref, ErrInvalid, err)
		}
		if dir := filepath.Join(s.cache, "rootfs", img.Digest.Encoded()); fileExists(filepath.Join(dir, ".gauntlet-unpacked")) {
			return dir, nil
		}
	}
	resolver := s.resolver(ctx)
	name, desc, err := resolver.Resolve(ctx, ref)
	if err != nil {
		return "", fmt.Errorf("unpack image %s: resolve: %w", ref, err)
	}
	if img.Digest != "" && desc.Digest != img.Digest {
		return "", fmt.Errorf("unpack image %s: the registry names %s, not the expected %s (the tag moved)", ref, desc.Digest, img.Digest)
	}
	dir := filepath.Join(s.cache, "rootfs", desc.Digest.Encoded())
	if fileExists(filepath.Join(dir, ".gauntlet-unpacked")) {
		return dir, nil
	}
	unlock, err := s.flock(ctx, "rootfs-"+desc.Digest.Encoded())
	if err != nil {
		return "", fmt.Errorf("unpack image %s: %w", ref, err)
	}
	defer unlock()
	if fileExists(filepath.Join(dir, ".gauntlet-unpacked")) { // unpacked meanwhile
		return dir, nil
	}

	begin := time.Now()
	cs, err := s.contentStore()
	if err != nil {
		return "", fmt.Errorf("unpack image %s: open the content store: %w", ref, err)
	}
	fetcher, err := resolver.Fetcher(ctx, name)
	if err != nil {
		return "", fmt.Errorf("unpack image %s: %w", ref, err)
	}
	platform := platforms.Default()
	handler := images.Handlers(
		remotes.FetchHandler(cs, fetcher),
		images.LimitManifests(images.ChildrenHandler(cs), platform, 1),
	)
	if err := images.Dispatch(ctx, handler, nil, desc); err != nil {
		return "", fmt.Errorf("unpack image %s: fetch: %w", ref, err)
	}
	man, err := images.Manifest(ctx, cs, desc, platform)
	if err != nil {
		return "", fmt.Errorf("unpack image %s: %w", ref, err)
	}
	var cfg ocispec.Image
	if err := readJSON(ctx, cs, man.Config, &cfg); err != nil {
		return "", fmt.Errorf("unpack image %s: config: %w", ref, err)
	}
	if len(cfg.RootFS.DiffIDs) != len(man.Layers) {
		return "", fmt.Errorf("unpack image %s: %d layers but %d diff ids in the config", ref, len(man.Layers), len(cfg.RootFS.DiffIDs))
	}

	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return "", fmt.Errorf("unpack image %s: %w", ref, err)
	}
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return "", fmt.Errorf("unpack image %s: %w", ref, err)
	}
	for i, l := range man.Layers {
		if err := applyLayer(ctx, cs, l, cfg.RootFS.DiffIDs[i], tmp); err != nil {
			os.RemoveAll(tmp)
			return "", fmt.Errorf("unpack image %s: layer %d (%s): %w", ref, i, l.Digest, err)
		}
	}
	// The image's runtime configuration (ENV, WORKDIR, USER) beside the directory,
	// for the runtime that runs it (UnpackedConfig).
	if err := writeConfig(dir, cfg.Config); err != nil {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("unpack image %s: %w", ref, err)
	}
	// The marker tells a complete directory from one a crash interrupted; it sits at
	// the root of the lower layer, where a sandbox sees it, so it says what it is.
	if err := os.WriteFile(filepath.Join(tmp, ".gauntlet-unpacked"), []byte(ref+"\n"+desc.Digest.String()+"\n"), 0o444); err != nil {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("unpack image %s: %w", ref, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return "", fmt.Errorf("unpack image %s: %w", ref, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", fmt.Errorf("unpack image %s: %w", ref, err)
	}
	s.log.Info("image unpacked", "ref", ref, "digest", desc.Digest, "dir", dir, "took", time.Since(begin).Round(time.Millisecond))
	return dir, nil
}

// applyLayer applies one layer to dir, checking the uncompressed stream's digest.
func applyLayer(ctx context.Context, cs content.Store, l ocispec.Descriptor, diffID digest.Digest, dir string) error {
	ra, err := cs.ReaderAt(ctx, l)
	if err != nil {
		return err
	}
	defer ra.Close()
	ds, err := compression.DecompressStream(content.NewReader(ra))
	if err != nil {
		return err
	}
	defer ds.Close()
	verifier := diffID.Verifier()
	if _, err := archive.Apply(ctx, dir, io.TeeReader(ds, verifier)); err != nil {
		return err
	}
	// Apply stops at the tar's end marker; the digest covers the padding after it.
	if _, err := io.Copy(verifier, ds); err != nil {
		return err
	}
	if !verifier.Verified() {
		return fmt.Errorf("its content does not match diff id %s", diffID)
	}
	return nil
}

func readJSON(ctx context.Context, p content.Provider, desc ocispec.Descriptor, v any) error {
	b, err := content.ReadBlob(ctx, p, desc)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// configPath is where Unpack keeps the runtime configuration of the image unpacked at dir.
func configPath(dir string) string { return dir + ".config.json" }

func writeConfig(dir string, c ocispec.ImageConfig) error {
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	tmp := configPath(dir) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o444); err != nil {
		return err
	}
	return os.Rename(tmp, configPath(dir))
}

// UnpackedConfig returns the runtime configuration (ENV, WORKDIR, USER, ...) of the image
// Unpack unpacked at dir. A directory unpacked by a gauntlet before it kept the
// configuration has none: the zero config.
func (s *Store) UnpackedConfig(dir string) (ocispec.ImageConfig, error) {
	var c ocispec.ImageConfig
	b, err := os.ReadFile(configPath(dir))
	if errors.Is(err, fs.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return c, fmt.Errorf("image config of %s: %w", dir, err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("image config of %s: %w", dir, err)
	}
	return c, nil
}
