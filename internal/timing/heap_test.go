package timing_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/timing"
)

type item struct {
	name  string
	slots [2]int
}

func newItem(name string) *item { return &item{name: name, slots: [2]int{-1, -1}} }

// A heap keeps its items in key order and their slots true, so an item is removed in place;
// one item sits in two heaps, one slot each.
func TestHeap(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	a := timing.NewHeap(func(it *item) *int { return &it.slots[0] })
	b := timing.NewHeap(func(it *item) *int { return &it.slots[1] })
	x, y, z := newItem("x"), newItem("y"), newItem("z")

	require.True(t, a.Push(x, t0.Add(3*time.Second)), "the first item is the head")
	require.True(t, a.Push(y, t0.Add(time.Second)), "an earlier item becomes the head")
	require.False(t, a.Push(z, t0.Add(2*time.Second)), "a later item does not")
	require.True(t, b.Push(x, t0))
	require.Equal(t, 3, a.Len())
	require.True(t, a.Queued(z))
	require.Equal(t, 0, x.slots[1], "x's slot in the second heap")

	a.Remove(z)
	require.False(t, a.Queued(z))
	require.Equal(t, -1, z.slots[0])
	a.Remove(z) // not there: no change
	require.Equal(t, 2, a.Len())

	head, at, ok := a.Head()
	require.True(t, ok)
	require.Same(t, y, head)
	require.Equal(t, t0.Add(time.Second), at)

	a.RekeyHead(t0.Add(4 * time.Second)) // y moves behind x
	require.Same(t, x, a.Pop())
	require.Same(t, y, a.Pop())
	require.Equal(t, -1, x.slots[0])
	require.Equal(t, 0, x.slots[1], "popping from one heap left the other's slot alone")
	_, _, ok = a.Head()
	require.False(t, ok)
}
