package extent

import (
	"encoding/json"
	"fmt"
	"tern/volume/ids"

	"github.com/google/uuid"
)

// fence is the content of fence.json.
type fence struct {
	HighestGen ids.Generation `json:"highest_gen"`
	// Holder is the upstairs that activated at HighestGen (zero when
	// unknown); it alone may activate at that generation again.
	Holder uuid.UUID `json:"holder,omitzero"`
}

// readFence reads fence.json; a missing file means generation 0.
func readFence(fsys FS) (fence, error) {
	js, err := fsys.ReadFile(fenceFileName)
	if isNotExist(err) {
		return fence{}, nil
	}
	if err != nil {
		return fence{}, fmt.Errorf("read fence: %w", err)
	}
	var f fence
	if err := json.Unmarshal(js, &f); err != nil {
		// fence.json is only ever replaced by rename, so a crash cannot
		// garble it.
		return fence{}, fmt.Errorf("%w: decode %s: %w", ErrBadRegion, fenceFileName, err)
	}
	return f, nil
}

// GenHolder returns the highest activation generation and the upstairs
// that holds it (zero if it was set without one).
func (r *Region) GenHolder() (ids.Generation, uuid.UUID) {
	r.genMu.Lock()
	defer r.genMu.Unlock()
	return r.highestGen, r.genHolder
}

// HighestGen returns the highest activation generation ever accepted by
// this region (0 for a new region).
func (r *Region) HighestGen() ids.Generation {
	r.genMu.Lock()
	defer r.genMu.Unlock()
	return r.highestGen
}

// SetHighestGen durably records g as the highest activation generation
// accepted (temporary file, fsync, rename, fsync of the directory) before
// returning. Setting the current value again is a no-op; a lower value
// fails with ErrStaleGeneration.
func (r *Region) SetHighestGen(g ids.Generation) error {
	return r.SetGenHolder(g, uuid.Nil)
}

// SetGenHolder is SetHighestGen that also records which upstairs holds g.
// Recording a new holder at the current generation is allowed (the
// caller decides whether that is legitimate); a lower generation fails
// with ErrStaleGeneration.
func (r *Region) SetGenHolder(g ids.Generation, holder uuid.UUID) error {
	if err := r.begin(); err != nil {
		return fmt.Errorf("set highest generation: %w", err)
	}
	defer r.end()
	r.genMu.Lock()
	defer r.genMu.Unlock()
	switch {
	case g == r.highestGen && holder == r.genHolder:
		return nil
	case g < r.highestGen:
		return fmt.Errorf("set highest generation %d: %w (%d)", g, ErrStaleGeneration, r.highestGen)
	case r.readOnly:
		return fmt.Errorf("set highest generation: %w", ErrReadOnly)
	}
	js, err := json.Marshal(fence{HighestGen: g, Holder: holder})
	if err != nil {
		return fmt.Errorf("encode fence: %w", err)
	}
	if err := r.fsys.WriteFileAtomic(fenceFileName, append(js, '\n')); err != nil {
		return fmt.Errorf("set highest generation: %w", err)
	}
	r.highestGen, r.genHolder = g, holder
	return nil
}
