package release

import (
	"archive/tar"
	"archive/zip"
	"compress/gzip"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// archiveFile is one file of an archive: its name inside and where it is.
type archiveFile struct {
	name, path string
	mode       fs.FileMode
}

// tarDir writes dir as an uncompressed tar (an OCI layout is tarred as is:
// its blobs are compressed already), entries sorted and dated t.
func tarDir(dir, out string, t time.Time) error {
	var files []archiveFile
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		files = append(files, archiveFile{name: filepath.ToSlash(rel), path: path, mode: 0o644})
		return nil
	})
	if err != nil {
		return err
	}
	return writeTar(out, files, t, false)
}

// writeTar writes files (WalkDir and callers give them sorted) into a tar,
// gzipped when compress is set, owned by root and dated t.
func writeTar(out string, files []archiveFile, t time.Time, compress bool) (err error) {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	var w io.Writer = f
	var gz *gzip.Writer
	if compress {
		gz = gzip.NewWriter(f)
		gz.ModTime = t.UTC()
		w = gz
	}
	tw := tar.NewWriter(w)
	for _, a := range files {
		if err := addTar(tw, a, t); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if gz != nil {
		return gz.Close()
	}
	return nil
}

func addTar(tw *tar.Writer, a archiveFile, t time.Time) error {
	src, err := os.Open(a.path)
	if err != nil {
		return err
	}
	defer func() { _ = src.Close() }()
	st, err := src.Stat()
	if err != nil {
		return err
	}
	hdr := &tar.Header{Name: a.name, Mode: int64(a.mode), Size: st.Size(), ModTime: t.UTC(), Typeflag: tar.TypeReg, Format: tar.FormatPAX}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	_, err = io.Copy(tw, src)
	return err
}

// writeZip writes files into a zip (for Windows), dated t.
func writeZip(out string, files []archiveFile, t time.Time) (err error) {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	zw := zip.NewWriter(f)
	for _, a := range files {
		if err := addZip(zw, a, t); err != nil {
			return err
		}
	}
	return zw.Close()
}

func addZip(zw *zip.Writer, a archiveFile, t time.Time) error {
	src, err := os.Open(a.path)
	if err != nil {
		return err
	}
	defer func() { _ = src.Close() }()
	hdr := &zip.FileHeader{Name: a.name, Method: zip.Deflate, Modified: t.UTC()}
	hdr.SetMode(a.mode)
	w, err := zw.CreateHeader(hdr)
	if err != nil {
		return err
	}
	_, err = io.Copy(w, src)
	return err
}
