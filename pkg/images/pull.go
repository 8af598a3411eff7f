package images

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
)

// Pull makes img available in the containerd image store c talks to (in the namespace
// of ctx, else c's default), unpacked for snapshotter, and returns it. It pulls through
// containerd from the registry img.Ref names, with the docker config's credentials,
// unless the store already holds the image: with img.Digest set, the same digest
// unpacked; without, any image of that name (as "pull if not present" does; a tag
// that moved is not followed then: pin a digest, or Build's content tags, to be
// sure). Pull is how a task's image reaches the containerd runtime.
func (s *Store) Pull(ctx context.Context, c *client.Client, img Image, snapshotter string) (client.Image, error) {
	ctx = quiet(ctx)
	ref, err := normalize(img.Ref)
	if err != nil {
		return nil, fmt.Errorf("pull image: %w", err)
	}
	have, err := c.GetImage(ctx, ref)
	switch {
	case err == nil && (img.Digest == "" || have.Target().Digest == img.Digest):
		ok, err := have.IsUnpacked(ctx, snapshotter)
		if err != nil {
			return nil, fmt.Errorf("pull image %s: is it unpacked for %s: %w", ref, snapshotter, err)
		}
		if !ok {
			if err := have.Unpack(ctx, snapshotter); err != nil {
				return nil, fmt.Errorf("pull image %s: unpack for %s: %w", ref, snapshotter, err)
			}
		}
		return have, nil
	case err != nil && !errdefs.IsNotFound(err):
		return nil, fmt.Errorf("pull image %s: look it up in containerd: %w", ref, err)
	}
	begin := time.Now()
	got, err := c.Pull(ctx, ref,
		client.WithResolver(s.resolver(ctx)),
		client.WithPullUnpack,
		client.WithPullSnapshotter(snapshotter))
	if err != nil {
		if errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("pull image %s: %w: %v", ref, ErrNotFound, err)
		}
		return nil, fmt.Errorf("pull image %s: %w", ref, err)
	}
	if img.Digest != "" && got.Target().Digest != img.Digest {
		return nil, fmt.Errorf("pull image %s: the registry gave %s, not the expected %s (the tag moved)", ref, got.Target().Digest, img.Digest)
	}
	s.log.Info("image pulled into containerd", "ref", ref, "digest", got.Target().Digest, "took", time.Since(begin).Round(time.Millisecond))
	return got, nil
}
