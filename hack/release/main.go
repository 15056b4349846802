// Command release assembles a release into a directory (make release;
// docs/releasing.md). It only reads flags and calls internal/release.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"time"

	"github.com/fencekeeper/fencekeeper/internal/release"
)

func main() {
	var c release.Config
	var epoch string
	flag.StringVar(&c.Version, "version", "", "the release tag, v-semver (e.g. v0.1.0)")
	flag.StringVar(&c.Commit, "commit", "", "the commit the release is built from")
	flag.StringVar(&c.Out, "out", "dist/release", "the output directory (absent or empty)")
	flag.StringVar(&c.LDFlags, "ldflags", "", "linker flags stamping internal/version (the Makefile's LDFLAGS)")
	flag.StringVar(&c.Image, "image", "", "the manager image, fully qualified; a tag is dropped, the digest is pinned (e.g. ghcr.io/fencekeeper/manager)")
	flag.StringVar(&c.Source, "source", "https://github.com/fencekeeper/fencekeeper", "the source repository (image label)")
	flag.StringVar(&c.Helm, "helm", "helm", "the helm binary")
	flag.StringVar(&c.Kubectl, "kubectl", "kubectl", "the kubectl binary")
	flag.StringVar(&epoch, "source-date-epoch", "", "the commit's time in Unix seconds: every timestamp in the artifacts")
	platforms := flag.String("platforms", "", "the platforms to build the image and kubectl-fence for, os/arch,...; empty is all (fewer is for checking a release, never for publishing one)")
	renderInstall := flag.Bool("render-install", false, "only print config/default rendered for -image (make build-installer, make deploy) and exit")
	flag.Parse()
	if *renderInstall {
		out, err := release.RenderInstall(context.Background(), c.Kubectl, ".", c.Image, "")
		if err != nil {
			fmt.Fprintln(os.Stderr, "render-install:", err)
			os.Exit(1)
		}
		_, _ = os.Stdout.Write(out)
		return
	}
	var err error
	if c.Platforms, err = release.ParsePlatforms(*platforms, release.PluginPlatforms); err != nil {
		fmt.Fprintln(os.Stderr, "release: RELEASE_PLATFORMS:", err)
		os.Exit(1)
	}
	if err := run(&c, epoch); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func run(c *release.Config, epoch string) error {
	secs, err := strconv.ParseInt(epoch, 10, 64)
	if err != nil {
		return fmt.Errorf("-source-date-epoch %q is not Unix seconds (make release passes the commit's time)", epoch)
	}
	c.Created = time.Unix(secs, 0).UTC()
	if c.Root, err = os.Getwd(); err != nil {
		return err
	}
	if c.Out, err = filepath.Abs(c.Out); err != nil {
		return err
	}
	c.Log = os.Stderr
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	res, err := release.Build(ctx, *c)
	if err != nil {
		return err
	}
	fmt.Println(res.ImageRef)
	return nil
}
