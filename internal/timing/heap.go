package timing

import (
	"container/heap"
	"time"
)

// Heap is a min-heap of items by time. Each entry carries its key, so comparisons read the
// heap's own array and not 100,000 items scattered in memory; each item records its index in
// the heap in a slot of its own that the heap finds through an accessor func, so removing an
// item costs O(log n), and one item may sit in several heaps (one slot each). A lessor keeps
// its held leases in two: the heartbeat's, by renewal time, and the trust watch's, by the end
// of the trust window. Not safe for concurrent use: its owner guards it (and the slots).
type Heap[T any] struct {
	h entries[T]
}

// NewHeap returns an empty heap whose items keep their index at slot(item): -1 while not in
// the heap. A new item's slot must read -1.
func NewHeap[T any](slot func(T) *int) Heap[T] {
	return Heap[T]{h: entries[T]{slot: slot}}
}

type entry[T any] struct {
	at   time.Time
	item T
}

// entries is Heap's container/heap.Interface, kept out of Heap's method set.
type entries[T any] struct {
	slot func(T) *int
	es   []entry[T]
}

func (h *entries[T]) Len() int           { return len(h.es) }
func (h *entries[T]) Less(i, j int) bool { return h.es[i].at.Before(h.es[j].at) }
func (h *entries[T]) Swap(i, j int) {
	e := h.es
	e[i], e[j] = e[j], e[i]
	*h.slot(e[i].item), *h.slot(e[j].item) = i, j
}
func (h *entries[T]) Push(x any) {
	e := x.(entry[T])
	*h.slot(e.item) = len(h.es)
	h.es = append(h.es, e)
}
func (h *entries[T]) Pop() any {
	last := len(h.es) - 1
	e := h.es[last]
	h.es[last] = entry[T]{}
	h.es = h.es[:last]
	*h.slot(e.item) = -1
	return e
}

// Len returns how many items h holds.
func (h *Heap[T]) Len() int { return len(h.h.es) }

// Push adds item keyed by at and reports whether it is now the earliest. O(log n).
func (h *Heap[T]) Push(item T, at time.Time) bool {
	heap.Push(&h.h, entry[T]{at: at, item: item})
	return *h.h.slot(item) == 0
}

// Queued reports whether item is in h.
func (h *Heap[T]) Queued(item T) bool { return *h.h.slot(item) >= 0 }

// Remove takes item out of h, if it is there. O(log n).
func (h *Heap[T]) Remove(item T) {
	if i := *h.h.slot(item); i >= 0 {
		heap.Remove(&h.h, i)
	}
}

// Head returns the earliest item and its key; ok is false when h is empty.
func (h *Heap[T]) Head() (item T, at time.Time, ok bool) {
	if len(h.h.es) == 0 {
		return item, time.Time{}, false
	}
	e := h.h.es[0]
	return e.item, e.at, true
}

// Pop removes and returns the earliest item. h must not be empty. O(log n).
func (h *Heap[T]) Pop() T { return heap.Pop(&h.h).(entry[T]).item }

// RekeyHead moves the earliest item to key at. h must not be empty. O(log n).
func (h *Heap[T]) RekeyHead(at time.Time) {
	h.h.es[0].at = at
	heap.Fix(&h.h, 0)
}
