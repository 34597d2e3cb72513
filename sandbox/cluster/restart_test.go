package cluster

import (
	"context"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TestRestartKeepsState: after kube-apiserver and etcd are each killed and
// restarted, the API server answers on the same address with what was
// stored before, the old processes are gone, and the logs continue.
func TestRestartKeepsState(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cp, err := Start(ctx, Options{NoControllerManager: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Stop()
	client, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().ConfigMaps("default").Create(ctx, &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kept"}, Data: map[string]string{"a": "b"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, component := range []string{ComponentAPIServer, ComponentEtcd} {
		old := cp.pids()
		if err := cp.Restart(ctx, component); err != nil {
			t.Fatalf("restart %s: %v", component, err)
		}
		now := cp.pids()
		for i := range old {
			if old[i] != now[i] && alive(old[i]) {
				t.Errorf("%s: the old process %d is still running", component, old[i])
			}
		}
		if (component == ComponentAPIServer && old[1] == now[1]) || (component == ComponentEtcd && old[0] == now[0]) {
			t.Errorf("%s: not restarted (same pid)", component)
		}
		var cm *v1.ConfigMap
		for range 100 { // etcd back does not mean the API server has reconnected
			if cm, err = client.CoreV1().ConfigMaps("default").Get(ctx, "kept", metav1.GetOptions{}); err == nil {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err != nil || cm.Data["a"] != "b" {
			t.Fatalf("after restarting %s: %v %v", component, cm, err)
		}
	}
	if err := cp.Restart(ctx, "kube-controller-manager"); err == nil || !strings.Contains(err.Error(), "only etcd and kube-apiserver") {
		t.Errorf("restart of another component: %v", err)
	}
	if n := strings.Count(cp.LogTail(ComponentAPIServer, 1000000), "Serving securely"); n < 2 {
		t.Errorf("the API server's log shows %d starts, want both (the restart appends)", n)
	}
}
