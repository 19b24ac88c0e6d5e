package relay

import "sync"

// heldRows are the keyed rows this relay's batches in flight hold, from
// their claim until their transaction ends. runBatch adds and removes its
// rows; each claim reads the list and does not try to lock them.
type heldRows struct {
	mu  sync.Mutex
	ids map[int64]struct{}
}

func newHeldRows() *heldRows { return &heldRows{ids: map[int64]struct{}{}} }

// add adds the keyed rows of a batch just claimed, and returns them. Called
// under the claim floor's lock, so that the next claim sees them.
func (h *heldRows) add(rows []*claimed) []int64 {
	var ids []int64
	for _, c := range rows {
		if c.msg.HasKey {
			ids = append(ids, c.msg.ID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, id := range ids {
		h.ids[id] = struct{}{}
	}
	return ids
}

// remove frees a batch's keyed rows once its transaction has ended.
func (h *heldRows) remove(ids []int64) {
	if len(ids) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, id := range ids {
		delete(h.ids, id)
	}
}

// list returns the held rows, for a claim.
func (h *heldRows) list() []int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	ids := make([]int64, 0, len(h.ids))
	for id := range h.ids {
		ids = append(ids, id)
	}
	return ids
}
