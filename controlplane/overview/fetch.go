package overview

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	schedclient "github.com/tessera-gpu/tessera/controlplane/client"
)

// Fetch lists what Build needs from the API server. A cluster without the
// tessera CRDs has no queues and gangs; that is not an error.
func Fetch(ctx context.Context, cfg *rest.Config, now time.Time) (Cluster, error) {
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return Cluster{}, fmt.Errorf("kubernetes client: %w", err)
	}
	sched, err := schedclient.NewForConfig(cfg)
	if err != nil {
		return Cluster{}, fmt.Errorf("scheduling client: %w", err)
	}
	in := Input{Now: now}
	slices, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return Cluster{}, fmt.Errorf("list ResourceSlices: %w", err)
	}
	in.Slices = slices.Items
	claims, err := client.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return Cluster{}, fmt.Errorf("list ResourceClaims: %w", err)
	}
	in.Claims = claims.Items
	queues, err := sched.Queues().List(ctx, metav1.ListOptions{})
	switch {
	case err == nil:
		in.Queues = queues.Items
	case !apierrors.IsNotFound(err):
		return Cluster{}, fmt.Errorf("list Queues: %w", err)
	}
	groups, err := sched.PodGroups(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	switch {
	case err == nil:
		in.PodGroups = groups.Items
	case !apierrors.IsNotFound(err):
		return Cluster{}, fmt.Errorf("list PodGroups: %w", err)
	}
	return Build(in), nil
}
