//go:build !race

package upstairs

const raceEnabled = false
