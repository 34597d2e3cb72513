package catalog

import (
	"syscall"
	"testing"
	"time"
)

// processCPU is the CPU time this process has used. With -cpu 1 only one
// goroutine runs Go code at a time, so objects per CPU-second is the throughput of
// one core even on a machine busy with other work, where wall-clock objects/s
// drops with the load.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchmarkMap maps one object repeatedly with the compiled built-in catalog and
// reports objects mapped per wall-clock second and per CPU second.
func benchmarkMap(b *testing.B, rel string) {
	c := newBuiltinCatalog(b)
	docs := readManifests(b, rel)
	obj := docs[0].Object
	if _, err := c.Map(obj); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU()
	for i := 0; i < b.N; i++ {
		if _, err := c.Map(obj); err != nil {
			b.Fatal(err)
		}
	}
	cpu := processCPU() - cpu0
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "objects/s")
	if cpu > 0 {
		b.ReportMetric(float64(b.N)/cpu.Seconds(), "objects/cpu-s")
	}
}

func BenchmarkMapPyTorchJob(b *testing.B) {
	benchmarkMap(b, "PyTorchJob/training-operator__pytorch_job_mnist_nccl.yaml")
}

func BenchmarkMapJobSet(b *testing.B) {
	benchmarkMap(b, "JobSet/jobset__paralleljobs.yaml")
}

func BenchmarkMapLeaderWorkerSet(b *testing.B) {
	benchmarkMap(b, "LeaderWorkerSet/lws__vllm-gpu-lws.yaml")
}
