package upstairs

// jobQueue holds jobs in increasing ID order. Appends are the common case
// (IDs are issued in order); replays and rerouted reads insert.
type jobQueue struct {
	items []*job
	head  int
}

func (q *jobQueue) len() int { return len(q.items) - q.head }

func (q *jobQueue) insert(j *job) {
	if n := len(q.items); n == q.head || q.items[n-1].id < j.id {
		q.items = append(q.items, j)
		return
	}
	i := q.head
	for i < len(q.items) && q.items[i].id < j.id {
		i++
	}
	q.items = append(q.items, nil)
	copy(q.items[i+1:], q.items[i:])
	q.items[i] = j
}

func (q *jobQueue) pop() (*job, bool) {
	if q.head == len(q.items) {
		return nil, false
	}
	j := q.items[q.head]
	q.items[q.head] = nil
	q.head++
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	} else if q.head > 64 && q.head*2 > len(q.items) {
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	return j, true
}

func (q *jobQueue) clear() {
	clear(q.items)
	q.items, q.head = q.items[:0], 0
}
