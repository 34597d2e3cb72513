package scheduler

import (
	"math"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/quota"
)

func statusEqual(a, b *v1alpha1.PodGroupStatus) bool { return equality.Semantic.DeepEqual(a, b) }

func queueStatusEqual(a, b *v1alpha1.QueueStatus) bool { return equality.Semantic.DeepEqual(a, b) }

// toQuantities renders usage: GPU units with three decimals, CPU in millicores, memory bytes.
func toQuantities(u quota.Usage) map[string]resource.Quantity {
	out := map[string]resource.Quantity{}
	for _, r := range quota.Resources {
		v := u[r]
		switch r {
		case v1alpha1.ResourceMemory:
			out[r] = *resource.NewQuantity(int64(v), resource.BinarySI)
		default:
			out[r] = *resource.NewMilliQuantity(int64(math.Round(v*1000)), resource.DecimalSI)
		}
	}
	return out
}
