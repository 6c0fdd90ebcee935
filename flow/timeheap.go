package flow

// timeHeap is a container/heap min-heap of items ordered by time. Each
// item keeps its index in the heap (for heap.Fix and heap.Remove); -1 once
// popped.
type timeHeap[T timed[T]] []T

type timed[T any] interface {
	before(T) bool
	setIndex(int)
}

func (h timeHeap[T]) Len() int           { return len(h) }
func (h timeHeap[T]) Less(i, j int) bool { return h[i].before(h[j]) }
func (h timeHeap[T]) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].setIndex(i)
	h[j].setIndex(j)
}
func (h *timeHeap[T]) Push(x any) {
	it := x.(T)
	it.setIndex(len(*h))
	*h = append(*h, it)
}
func (h *timeHeap[T]) Pop() any {
	old := *h
	it := old[len(old)-1]
	var zero T
	old[len(old)-1] = zero
	*h = old[:len(old)-1]
	it.setIndex(-1)
	return it
}
