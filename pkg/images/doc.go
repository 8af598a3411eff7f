// Package images gives a task its image: it builds a build context (a task's
// environment/ folder with a Dockerfile) with a real builder, or takes an image
// reference, and delivers the image to both sandbox runtimes: pulled into containerd's
// image store for the containerd runtime ([Store.Pull]), unpacked into a read-only
// directory for the process runtime's overlay ([Store.Unpack]).
//
// The builder is Debian's buildah, run as a command (see docs/images.md for why, not
// BuildKit): RUN steps in buildah's chroot isolation (no container engine, no daemon),
// its storage (overlay driver by default) under the Store's cache directory. Built
// images are pushed to a registry (Options.Registry; in development and tests the
// loopback docker-registry of package registrylocal) under a tag made of the build
// context's digest ([ContextDigest]), so the registry itself is the build cache: a
// context already built is found by one HEAD request and the builder is not run, by
// this process or any other machine using that registry. Everything reaches the
// runtimes through a registry: containerd pulls an image from the registry its
// reference names, with the credentials of the usual docker config file
// (~/.docker/config.json or $DOCKER_CONFIG: auths, credsStore and credHelpers), as
// does Unpack, which needs no containerd.
//
// Ownership: a [Store] owns its cache directory (Options.CacheDir): buildah's storage,
// build logs, locks, fetched content and unpacked root filesystems. It never deletes
// images from a registry or from containerd.
//
// Concurrency: a Store is safe for concurrent use. Builds of the same context and
// unpacks of the same image are serialized by file locks under the cache directory,
// within the process and across processes sharing it, so each runs once; a caller
// waiting for another's build gives up when its context ends.
//
// Errors: a bad source wraps [ErrInvalid] naming the field; a missing buildah
// [ErrNotInstalled]; a failed build [ErrBuild] with the end of the builder's output
// (the whole log stays under CacheDir/logs); an image the registry lacks [ErrNotFound].
// Every error names the operation and the image or context.
package images
