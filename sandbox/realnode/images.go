package realnode

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
)

// The node has no registry: its two images are OCI image layouts built here
// from static binaries and imported with `ctr images import`. Pods use them
// with imagePullPolicy Never.
const (
	// PauseImage is the pods' sandbox image: sandbox/nodebin/pause, built by
	// sandbox/nodebin.
	PauseImage = "tessera.local/pause:realnode"
	// BusyboxImage holds Debian's busybox-static with its applets linked in
	// /bin, for test containers that print what they got.
	BusyboxImage = "tessera.local/busybox:realnode"
)

// BusyboxPath is where Debian's busybox-static puts the binary.
const BusyboxPath = "/bin/busybox"

type layerFile struct {
	name   string // path in the image, without a leading slash
	mode   int64
	data   []byte
	link   string // symlink target when set
	isDir  bool
	fromFS string // host file to copy
}

// writeImage writes an OCI image layout tarball with one layer holding files.
func writeImage(path, ref string, files []layerFile, entrypoint, cmd, env []string) error {
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	for _, f := range files {
		hdr := &tar.Header{Name: f.name, Mode: f.mode, Uid: 0, Gid: 0, Format: tar.FormatPAX}
		switch {
		case f.isDir:
			hdr.Typeflag, hdr.Name = tar.TypeDir, f.name+"/"
		case f.link != "":
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, f.link
		default:
			data := f.data
			if f.fromFS != "" {
				var err error
				if data, err = os.ReadFile(f.fromFS); err != nil {
					return fmt.Errorf("image %s: %w", ref, err)
				}
			}
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(data))
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			if _, err := tw.Write(data); err != nil {
				return err
			}
			continue
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	diffID := digest(layer.Bytes())
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	if _, err := zw.Write(layer.Bytes()); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}

	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config":       map[string]any{"Entrypoint": entrypoint, "Cmd": cmd, "Env": env},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{diffID}},
	})
	if err != nil {
		return err
	}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        descriptor("application/vnd.oci.image.config.v1+json", config, nil),
		"layers":        []any{descriptor("application/vnd.oci.image.layer.v1.tar+gzip", gz.Bytes(), nil)},
	})
	if err != nil {
		return err
	}
	tag := ref[strings.LastIndex(ref, ":")+1:]
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests": []any{descriptor("application/vnd.oci.image.manifest.v1+json", manifest, map[string]string{
			"io.containerd.image.name":          ref,
			"org.opencontainers.image.ref.name": tag,
		})},
	})
	if err != nil {
		return err
	}

	out, err := os.Create(path)
	if err != nil {
		return err
	}
	defer out.Close()
	ow := tar.NewWriter(out)
	entries := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{blobPath(config), config},
		{blobPath(manifest), manifest},
		{blobPath(gz.Bytes()), gz.Bytes()},
	}
	for _, e := range entries {
		if err := ow.WriteHeader(&tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.data)), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		if _, err := ow.Write(e.data); err != nil {
			return err
		}
	}
	if err := ow.Close(); err != nil {
		return err
	}
	return out.Close()
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func blobPath(b []byte) string {
	return "blobs/sha256/" + strings.TrimPrefix(digest(b), "sha256:")
}

func descriptor(mediaType string, b []byte, annotations map[string]string) map[string]any {
	d := map[string]any{"mediaType": mediaType, "digest": digest(b), "size": len(b)}
	if annotations != nil {
		d["annotations"] = annotations
	}
	return d
}

// buildImages writes the pause and busybox images into the node's directory.
func (n *Node) buildImages() error {
	pause := n.path("images", "pause.tar")
	if err := writeImage(pause, PauseImage, []layerFile{
		{name: "pause", mode: 0o755, fromFS: n.bin("pause")},
	}, []string{"/pause"}, nil, nil); err != nil {
		return fmt.Errorf("build the pause image: %w", err)
	}
	applets, err := exec.Command(BusyboxPath, "--list").Output()
	if err != nil {
		return fmt.Errorf("list the applets of %s: %w", BusyboxPath, err)
	}
	// /etc as in any image: nvidia-cdi-hook's update-ldcache writes
	// /etc/ld.so.conf, its drop-ins and /etc/ld.so.cache there.
	files := []layerFile{{name: "bin", mode: 0o755, isDir: true}, {name: "etc", mode: 0o755, isDir: true},
		{name: "tmp", mode: 0o1777, isDir: true}, {name: "bin/busybox", mode: 0o755, fromFS: BusyboxPath}}
	for _, a := range strings.Fields(string(applets)) {
		if a != "busybox" {
			files = append(files, layerFile{name: "bin/" + a, mode: 0o777, link: "busybox"})
		}
	}
	busybox := n.path("images", "busybox.tar")
	if err := writeImage(busybox, BusyboxImage, files, nil, []string{"sh"}, []string{"PATH=/bin"}); err != nil {
		return fmt.Errorf("build the busybox image: %w", err)
	}
	n.images = []string{pause, busybox}
	return nil
}
