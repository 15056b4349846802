package release

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's runtime identity. The Dockerfile says the same (a test in
// this package holds it to these).
const (
	Entrypoint = "/manager"
	User       = "65532:65532" // nonroot, as distroless names it
)

// The image's file system: the static manager and the little it needs.
//   - /etc/passwd and /etc/group name uid/gid 65532 "nonroot", so tools
//     that show users (ps, kubectl debug) print a name.
//   - /tmp (1777) exists for the webhook certificate mount under
//     /tmp/k8s-webhook-server with a read-only root file system.
//   - No CA certificates: in a cluster the manager talks only to the API
//     server, which client-go verifies with the service account's ca.crt,
//     and it serves its webhooks with its own certificate. No time zone
//     data either: it formats times in UTC only.
const (
	etcPasswd = "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	etcGroup  = "root:x:0:\nnonroot:x:65532:\n"
)

// labels are the OCI annotations-as-labels every manifest and config carries.
func (c *Config) labels() map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":    "fencekeeper-manager",
		"org.opencontainers.image.version":  c.Version,
		"org.opencontainers.image.revision": c.Commit,
		"org.opencontainers.image.source":   c.Source,
		"org.opencontainers.image.licenses": "Apache-2.0",
		"org.opencontainers.image.created":  c.Created.UTC().Format(time.RFC3339),
	}
}

// buildImage builds the manager for each image platform built, writes the
// multi-arch OCI layout as a tar and the image SBOM, and records the index
// digest in res.
func (c *Config) buildImage(ctx context.Context, work string, res *Result) error {
	var adds []mutate.IndexAddendum
	var binaries []string
	for _, p := range only(ImagePlatforms, c.Platforms) {
		bin, err := c.goBuild(ctx, filepath.Join(work, "manager"), "./cmd/manager", p)
		if err != nil {
			return err
		}
		binaries = append(binaries, bin)
		img, err := c.platformImage(bin, p)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: p.OS, Architecture: p.Arch},
		}})
	}
	idx := mutate.IndexMediaType(mutate.AppendManifests(empty.Index, adds...), types.OCIImageIndex)
	idx = mutate.Annotations(idx, c.labels()).(v1.ImageIndex)
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	res.IndexDigest = digest.String()
	res.ImageRef = c.Image + "@" + res.IndexDigest

	dir := filepath.Join(work, "oci")
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	// The ref name lets skopeo's oci-archive:<file>:<version> pick the index.
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": c.Version,
	})); err != nil {
		return err
	}
	if err := tarDir(dir, filepath.Join(c.Out, ImageArchive(c.Version)), c.Created); err != nil {
		return err
	}
	return c.writeSBOM(filepath.Join(c.Out, ImageSBOM(c.Version)), "container", "fencekeeper-manager", binaries)
}

// platformImage is one platform's image: a single layer on nothing.
func (c *Config) platformImage(bin string, p Platform) (v1.Image, error) {
	layerTar, err := c.rootFS(bin)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layer)
	if err != nil {
		return nil, err
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = p.OS, p.Arch
	cf.Created = v1.Time{Time: c.Created.UTC()}
	cf.Config = v1.Config{
		User:       User,
		Entrypoint: []string{Entrypoint},
		WorkingDir: "/",
		Labels:     c.labels(),
	}
	cf.History = []v1.History{{Created: cf.Created, CreatedBy: "make release " + c.Version, Comment: "the static manager binary"}}
	return mutate.ConfigFile(img, cf)
}

// rootFS is the layer's tar: directories, /etc files and the binary, all
// owned by root and dated c.Created (the manager runs as 65532 and writes
// nothing in its image).
func (c *Config) rootFS(bin string) ([]byte, error) {
	manager, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	entries := []struct {
		name string
		mode int64
		body []byte
		dir  bool
	}{
		{"etc/", 0o755, nil, true},
		{"etc/group", 0o644, []byte(etcGroup), false},
		{"etc/passwd", 0o644, []byte(etcPasswd), false},
		{"home/", 0o755, nil, true},
		{"home/nonroot/", 0o700, nil, true},
		{"manager", 0o755, manager, false},
		{"tmp/", 0o1777, nil, true},
	}
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Mode: e.mode, ModTime: c.Created.UTC(), Typeflag: tar.TypeReg, Size: int64(len(e.body)), Format: tar.FormatPAX}
		if e.dir {
			hdr.Typeflag, hdr.Size = tar.TypeDir, 0
		}
		if e.name == "home/nonroot/" {
			hdr.Uid, hdr.Gid = 65532, 65532
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
