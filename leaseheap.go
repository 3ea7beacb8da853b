package fencelock

import (
	"container/heap"
	"time"
)

// A lessor keeps its held leases in two min-heaps of the same shape: the heartbeat's, by
// renewal time (heartbeat.go), and the trust watch's, by the end of the trust window
// (trustwatch.go). Each entry carries its key, so comparisons read the heap's own array and
// not 100,000 leases scattered in memory; each lease records its index in each heap
// (Lease.slots), so removing it costs O(log n).

// Heap identities: the index of a lease's slot for each heap.
const (
	renewHeap = iota
	trustHeap
)

type heapEntry struct {
	at    time.Time
	lease *Lease
}

// leaseHeap is a min-heap of leases by time. Guarded by Lessor.mu.
type leaseHeap struct {
	which   int // renewHeap or trustHeap: the slot of Lease.slots this heap keeps
	entries []heapEntry
}

func (h *leaseHeap) Len() int           { return len(h.entries) }
func (h *leaseHeap) Less(i, j int) bool { return h.entries[i].at.Before(h.entries[j].at) }
func (h *leaseHeap) Swap(i, j int) {
	e := h.entries
	e[i], e[j] = e[j], e[i]
	e[i].lease.slots[h.which], e[j].lease.slots[h.which] = i, j
}
func (h *leaseHeap) Push(x any) {
	e := x.(heapEntry)
	e.lease.slots[h.which] = len(h.entries)
	h.entries = append(h.entries, e)
}
func (h *leaseHeap) Pop() any {
	last := len(h.entries) - 1
	e := h.entries[last]
	h.entries[last] = heapEntry{}
	h.entries = h.entries[:last]
	e.lease.slots[h.which] = -1
	return e
}

// push adds lease keyed by at and reports whether it is now the earliest.
func (h *leaseHeap) push(lease *Lease, at time.Time) bool {
	heap.Push(h, heapEntry{at: at, lease: lease})
	return lease.slots[h.which] == 0
}

// queued reports whether lease is in h.
func (h *leaseHeap) queued(lease *Lease) bool { return lease.slots[h.which] >= 0 }

// remove takes lease out of h, if it is there.
func (h *leaseHeap) remove(lease *Lease) {
	if i := lease.slots[h.which]; i >= 0 {
		heap.Remove(h, i)
	}
}

// head returns the earliest entry; ok is false when h is empty.
func (h *leaseHeap) head() (e heapEntry, ok bool) {
	if len(h.entries) == 0 {
		return heapEntry{}, false
	}
	return h.entries[0], true
}

// pop removes and returns the earliest lease. h must not be empty.
func (h *leaseHeap) pop() *Lease { return heap.Pop(h).(heapEntry).lease }

// rekeyHead moves the earliest lease to key at.
func (h *leaseHeap) rekeyHead(at time.Time) {
	h.entries[0].at = at
	heap.Fix(h, 0)
}
