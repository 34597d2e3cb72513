package sandbox

import (
	"context"
	"io"
	"time"

	"k8s.io/client-go/rest"

	"github.com/tessera-gpu/tessera/controlplane/overview"
)

// renderTop prints one frame of `tessera top` for the sandbox.
func renderTop(ctx context.Context, cfg *rest.Config, w io.Writer) error {
	c, err := overview.Fetch(ctx, cfg, time.Now())
	if err != nil {
		return err
	}
	overview.Render(w, c, overview.Style{})
	return nil
}
