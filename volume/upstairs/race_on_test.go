//go:build race

package upstairs

// raceEnabled: the race detector is on; tests that race on purpose (a
// guest scribbling on a buffer in flight) skip.
const raceEnabled = true
