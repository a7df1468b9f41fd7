//go:build race

package extent

const raceEnabled = true
