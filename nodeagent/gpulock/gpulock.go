// Package gpulock serializes changes of one GPU's MIG state between the
// node agent (MIG mode, static layouts) and the kubelet plugin (MIG
// instances and MIG mode at prepare and unprepare), so that a resync never
// races a prepare on the same GPU. Changes of different GPUs run in
// parallel.
package gpulock

import "sync"

// Locks holds one mutex per GPU UUID. The zero value is ready to use; a
// nil *Locks locks nothing (a component running without the agent).
type Locks struct {
	mu   sync.Mutex
	gpus map[string]*sync.Mutex
}

// New returns an empty set of locks.
func New() *Locks { return &Locks{} }

// Lock takes the GPU's lock and returns the function that releases it.
func (l *Locks) Lock(gpuUUID string) (unlock func()) {
	if l == nil {
		return func() {}
	}
	l.mu.Lock()
	if l.gpus == nil {
		l.gpus = map[string]*sync.Mutex{}
	}
	m, ok := l.gpus[gpuUUID]
	if !ok {
		m = &sync.Mutex{}
		l.gpus[gpuUUID] = m
	}
	l.mu.Unlock()
	m.Lock()
	return m.Unlock
}
