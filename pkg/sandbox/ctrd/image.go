package ctrd

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// BaseImage is the reference of the image Create uses when Spec.Image is empty:
// busybox-static plus the agent, built on the host by BuildBaseImage (no registry is
// needed or reachable).
const BaseImage = "gauntlet.local/sandbox-base:latest"

// AgentPath is where the agent binary sits in the base image; it is the image's
// entrypoint and every sandbox's PID 1.
const AgentPath = "/.gauntlet/agent"

// busyboxPath is Debian's busybox-static binary (scripts/deps.sh installs it).
const busyboxPath = "/bin/busybox"

// epoch is the fixed modification time of every file in the image, so the same
// inputs give the same image digest and a second import is skipped.
var epoch = time.Unix(946684800, 0).UTC() // 2000-01-01

// layer is one uncompressed layer tarball and its digest (its diff id as well).
type layer struct {
	data   []byte
	digest digest.Digest
}

// ociLayout is an OCI image layout as a tar stream, ready for client.Import.
type ociLayout struct {
	tar      []byte
	manifest digest.Digest
}

// BuildBaseImage packs busybox (from the host's busybox-static) and the agent
// binary at agentBinary into an OCI image layout, imports it into containerd under
// BaseImage and unpacks it for the snapshotter. It does nothing when the image with
// the same content is already there and unpacked.
func BuildBaseImage(ctx context.Context, c *client.Client, snapshotter, agentBinary string) error {
	layout, err := baseLayout(agentBinary)
	if err != nil {
		return fmt.Errorf("build base image: %w", err)
	}
	if img, err := c.GetImage(ctx, BaseImage); err == nil && img.Target().Digest == layout.manifest {
		if ok, err := img.IsUnpacked(ctx, snapshotter); err == nil && ok {
			return nil
		}
	} else if err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("build base image: look up %s: %w", BaseImage, err)
	}
	if _, err := c.Import(ctx, bytes.NewReader(layout.tar)); err != nil {
		return fmt.Errorf("build base image: import: %w", err)
	}
	img, err := c.GetImage(ctx, BaseImage)
	if err != nil {
		return fmt.Errorf("build base image: after import: %w", err)
	}
	if err := img.Unpack(ctx, snapshotter); err != nil {
		return fmt.Errorf("build base image: unpack for %s: %w", snapshotter, err)
	}
	return nil
}

// baseLayout builds the two-layer image: busybox with its applet links and a small
// /etc, then the agent.
func baseLayout(agentBinary string) (ociLayout, error) {
	bb, err := busyboxLayer()
	if err != nil {
		return ociLayout{}, err
	}
	agentBin, err := os.ReadFile(agentBinary)
	if err != nil {
		return ociLayout{}, fmt.Errorf("read agent binary: %w", err)
	}
	ag, err := tarLayer([]tarEntry{
		{name: ".gauntlet", mode: 0o755, dir: true},
		{name: strings.TrimPrefix(AgentPath, "/"), mode: 0o755, data: agentBin},
	})
	if err != nil {
		return ociLayout{}, err
	}
	layers := []layer{bb, ag}

	cfg := ocispec.Image{
		Platform: ocispec.Platform{OS: "linux", Architecture: runtime.GOARCH},
		Config: ocispec.ImageConfig{
			Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/workspace", "LANG=C.UTF-8"},
			Entrypoint: []string{AgentPath},
			WorkingDir: "/",
		},
		RootFS: ocispec.RootFS{Type: "layers"},
	}
	created := epoch
	cfg.Created = &created
	for _, l := range layers {
		cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, l.digest)
	}
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return ociLayout{}, err
	}
	cfgDesc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: digest.FromBytes(cfgJSON), Size: int64(len(cfgJSON))}
	man := ocispec.Manifest{MediaType: ocispec.MediaTypeImageManifest, Config: cfgDesc}
	man.SchemaVersion = 2
	for _, l := range layers {
		man.Layers = append(man.Layers, ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayer, Digest: l.digest, Size: int64(len(l.data))})
	}
	manJSON, err := json.Marshal(man)
	if err != nil {
		return ociLayout{}, err
	}
	manDesc := ocispec.Descriptor{
		MediaType:   ocispec.MediaTypeImageManifest,
		Digest:      digest.FromBytes(manJSON),
		Size:        int64(len(manJSON)),
		Annotations: map[string]string{"io.containerd.image.name": BaseImage, ocispec.AnnotationRefName: "latest"},
		Platform:    &ocispec.Platform{OS: "linux", Architecture: runtime.GOARCH},
	}
	idx := ocispec.Index{MediaType: ocispec.MediaTypeImageIndex, Manifests: []ocispec.Descriptor{manDesc}}
	idx.SchemaVersion = 2
	idxJSON, err := json.Marshal(idx)
	if err != nil {
		return ociLayout{}, err
	}
	entries := []tarEntry{
		{name: ocispec.ImageLayoutFile, mode: 0o644, data: []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{name: ocispec.ImageIndexFile, mode: 0o644, data: idxJSON},
		{name: "blobs", mode: 0o755, dir: true},
		{name: "blobs/sha256", mode: 0o755, dir: true},
		{name: blobPath(cfgDesc.Digest), mode: 0o644, data: cfgJSON},
		{name: blobPath(manDesc.Digest), mode: 0o644, data: manJSON},
	}
	for _, l := range layers {
		entries = append(entries, tarEntry{name: blobPath(l.digest), mode: 0o644, data: l.data})
	}
	out, err := tarLayer(entries)
	if err != nil {
		return ociLayout{}, err
	}
	return ociLayout{tar: out.data, manifest: manDesc.Digest}, nil
}

func blobPath(d digest.Digest) string { return "blobs/sha256/" + d.Encoded() }

// busyboxLayer is busybox-static with a link per applet and the directories a
// sandbox needs.
func busyboxLayer() (layer, error) {
	bin, err := os.ReadFile(busyboxPath)
	if err != nil {
		return layer{}, fmt.Errorf("read %s (install busybox-static: scripts/deps.sh): %w", busyboxPath, err)
	}
	out, err := exec.Command(busyboxPath, "--list-full").Output()
	if err != nil {
		return layer{}, fmt.Errorf("%s --list-full: %w", busyboxPath, err)
	}
	entries := []tarEntry{
		{name: "bin", mode: 0o755, dir: true},
		{name: "sbin", mode: 0o755, dir: true},
		{name: "usr", mode: 0o755, dir: true},
		{name: "usr/bin", mode: 0o755, dir: true},
		{name: "usr/sbin", mode: 0o755, dir: true},
		{name: "etc", mode: 0o755, dir: true},
		{name: "dev", mode: 0o755, dir: true},
		{name: "proc", mode: 0o555, dir: true},
		{name: "sys", mode: 0o555, dir: true},
		{name: "run", mode: 0o755, dir: true},
		{name: "run/gauntlet", mode: 0o700, dir: true},
		{name: "root", mode: 0o700, dir: true},
		{name: "tmp", mode: 0o1777, dir: true},
		{name: "workspace", mode: 0o755, dir: true},
		{name: "bin/busybox", mode: 0o755, data: bin},
		{name: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/workspace:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")},
		{name: "etc/group", mode: 0o644, data: []byte("root:x:0:\nnogroup:x:65534:\n")},
	}
	seen := map[string]bool{"bin/busybox": true}
	var links []string
	for _, l := range strings.Fields(string(out)) {
		l = strings.TrimPrefix(l, "/")
		if l == "" || seen[l] || strings.Contains(l, "..") {
			continue
		}
		seen[l] = true
		links = append(links, l)
	}
	sort.Strings(links)
	for _, l := range links {
		dir := path.Dir(l)
		if dir != "bin" && dir != "sbin" && dir != "usr/bin" && dir != "usr/sbin" {
			continue
		}
		entries = append(entries, tarEntry{name: l, link: "/bin/busybox"})
	}
	return tarLayer(entries)
}

type tarEntry struct {
	name string
	mode int64
	dir  bool
	link string // symlink target
	data []byte
}

// tarLayer writes entries, in order, as a tar stream owned by root with fixed times.
func tarLayer(entries []tarEntry) (layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, ModTime: epoch, Format: tar.FormatPAX}
		switch {
		case e.dir:
			h.Typeflag, h.Name = tar.TypeDir, e.name+"/"
		case e.link != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, e.link, 0o777
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return layer{}, fmt.Errorf("tar %s: %w", e.name, err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(e.data); err != nil {
				return layer{}, fmt.Errorf("tar %s: %w", e.name, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return layer{}, err
	}
	return layer{data: buf.Bytes(), digest: digest.FromBytes(buf.Bytes())}, nil
}

var agentBuilds sync.Map // output path -> *agentBuild

type agentBuild struct {
	once sync.Once
	err  error
}

// BuildAgent compiles cmd/gauntlet-agent statically into dir and returns the
// binary's path. It needs the Go toolchain and this module's source (development
// machines and CI); a deployment passes a prebuilt Options.AgentBinary instead. One
// process builds each dir once.
func BuildAgent(ctx context.Context, dir string) (string, error) {
	out := filepath.Join(dir, "gauntlet-agent")
	v, _ := agentBuilds.LoadOrStore(out, &agentBuild{})
	b := v.(*agentBuild)
	b.once.Do(func() {
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, "github.com/gauntlet-rl/gauntlet/cmd/gauntlet-agent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if msg, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("build agent (needs the Go toolchain and gauntlet's source; or set Options.AgentBinary): %w: %s", err, msg)
		}
	})
	if b.err != nil {
		agentBuilds.Delete(out)
		return "", b.err
	}
	return out, nil
}

// stateKey is a short stable name for a state directory, used in container labels,
// cgroup paths and snapshot names so that runtimes over different state
// directories never see each other's sandboxes.
func stateKey(dir string) string {
	h := sha256.Sum256([]byte(dir))
	return hex.EncodeToString(h[:6])
}

// withNamespace puts the runtime's containerd namespace into ctx.
func withNamespace(ctx context.Context, ns string) context.Context {
	return namespaces.WithNamespace(ctx, ns)
}
