// Summarises a run of the HTTP caching conformance suite (cache-tests) for
// sidecache beside the suite's published nginx and Varnish results.
//
//   node summarise.mjs SUITE_DIR REASONS_TSV NAME=RESULTS.json... [--markdown OUT.md]
//
// Each test counts by its own outcome (the suite's determineTestResult
// without depends_on chains: a test whose prerequisite failed is still
// judged by what it asserted), which is how docs/conformance.md counts. The
// suite's own scoring (with chains) is printed beside it. Prints, per results
// file and per kind, passes out of the tests run; then the failing required
// tests with the reason from REASONS_TSV ("id<TAB>reason", '#' comments, a
// trailing '*' matches a prefix, a leading "CONFIG:" limits it to one config).
// With --markdown, writes the same as docs/conformance.md. Prints one line
// "FLOOR name required=N" per results file, for run.sh's floor check.
import fs from 'node:fs'
import path from 'node:path'
import { pathToFileURL } from 'node:url'

const args = process.argv.slice(2)
let markdownOut
const mdAt = args.indexOf('--markdown')
if (mdAt >= 0) {
  markdownOut = args[mdAt + 1]
  args.splice(mdAt, 2)
}
const [suiteDir, reasonsFile, ...runs] = args
if (!suiteDir || !reasonsFile || runs.length === 0) {
  console.error('usage: summarise.mjs SUITE_DIR REASONS_TSV NAME=RESULTS.json... [--markdown OUT.md]')
  process.exit(2)
}
const load = rel => import(pathToFileURL(path.join(suiteDir, rel)).href)
const suites = (await load('tests/index.mjs')).default
const { determineTestResult, resultTypes } = await load('test-engine/lib/results.mjs')

const reasons = new Map()
for (const line of fs.readFileSync(reasonsFile, 'utf8').split('\n')) {
  if (line.trim() === '' || line.startsWith('#')) continue
  const tab = line.indexOf('\t')
  if (tab < 0) throw new Error(`${reasonsFile}: no tab in line: ${line}`)
  reasons.set(line.slice(0, tab).trim(), line.slice(tab + 1).trim())
}

// An id ending in '*' gives the reason for every test id with that prefix;
// an exact id wins over a prefix, a longer prefix over a shorter one.
// "CONFIG:id" (or "CONFIG:prefix*") gives a reason for one config only.
function reasonFor (id, config) {
  return reasonIn(`${config}:${id}`, `${config}:`) || reasonIn(id, '')
}
function reasonIn (id, scope) {
  if (reasons.has(id)) return reasons.get(id)
  let best
  for (const [k, v] of reasons) {
    if (!k.startsWith(scope) || (scope === '' && /^[a-z]+:/.test(k))) continue
    if (k.endsWith('*') && id.startsWith(k.slice(0, -1)) && (!best || k.length > best[0].length)) best = [k, v]
  }
  return best && best[1]
}

const tests = []
for (const suite of suites) {
  for (const t of suite.tests) {
    if (t.browser_only === true) continue
    tests.push({ id: t.id, kind: t.kind || 'required', name: t.name, group: suite.name })
  }
}

const passed = r => r === resultTypes.pass || r === resultTypes.yes
function score (results, chains) {
  const by = { required: [0, 0], optimal: [0, 0], check: [0, 0] }
  const failing = []
  for (const t of tests) {
    if (results[t.id] === undefined) continue
    const r = determineTestResult(suites, t.id, results, chains)
    by[t.kind][1]++
    if (passed(r)) by[t.kind][0]++
    else if (t.kind === 'required') failing.push({ ...t, result: r, detail: results[t.id] })
  }
  return { by, failing }
}

const readJson = f => JSON.parse(fs.readFileSync(f, 'utf8'))
const columns = runs.map(spec => {
  const eq = spec.indexOf('=')
  const name = spec.slice(0, eq)
  return { name, results: readJson(spec.slice(eq + 1)), ours: true }
})
for (const name of ['nginx', 'varnish']) {
  columns.push({ name: `${name} (published)`, results: readJson(path.join(suiteDir, 'results', `${name}.json`)) })
}
for (const c of columns) {
  c.own = score(c.results, false)
  c.chained = score(c.results, true)
}

const out = []
const cell = ([p, n]) => `${p} / ${n}`
out.push('| kind | ' + columns.map(c => c.name).join(' | ') + ' |')
out.push('|---|' + columns.map(() => '---:|').join(''))
for (const kind of ['required', 'optimal', 'check']) {
  out.push(`| ${kind} | ` + columns.map(c => cell(c.own.by[kind])).join(' | ') + ' |')
}
out.push('| required, with the suite\'s dependency chains | ' +
  columns.map(c => cell(c.chained.by.required)).join(' | ') + ' |')
const table = out.join('\n')

const detail = d => {
  if (d === true) return ''
  if (Array.isArray(d)) return String(d[1] ?? d[0]).replace(/\s+/g, ' ').replace(/\|/g, '\\|').slice(0, 140)
  return String(d)
}
const sections = []
let unexplained = 0
for (const c of columns.filter(c => c.ours)) {
  const rows = ['| test | group | what the suite saw | why |', '|---|---|---|---|']
  for (const f of c.own.failing) {
    const why = reasonFor(f.id, c.name)
    if (!why) unexplained++
    rows.push(`| \`${f.id}\` | ${f.group} | ${detail(f.detail)} | ${why || '**no reason recorded**'} |`)
  }
  sections.push(`### Failing required tests: \`${c.name}\` (${c.own.failing.length})\n\n${rows.join('\n')}`)
}

console.log(table)
for (const c of columns.filter(c => c.ours)) {
  console.log(`\n${c.name}: failing required tests`)
  for (const f of c.own.failing) {
    console.log(`  ${f.id}: ${reasonFor(f.id, c.name) || 'NO REASON RECORDED'}\n      suite: ${detail(f.detail)}`)
  }
}
for (const c of columns.filter(c => c.ours)) {
  console.log(`FLOOR ${c.name} required=${c.own.by.required[0]} optimal=${c.own.by.optimal[0]}`)
}
if (unexplained > 0) console.log(`${unexplained} failing required test(s) have no reason in ${reasonsFile}`)

if (markdownOut) {
  const md = `# HTTP caching conformance

Generated by \`tests/conformance/run.sh\` (do not edit by hand; reasons live in
\`tests/conformance/reasons.tsv\`). The suite is the public cache-tests
suite (cache-tests.fyi, a checkout outside the repository: see
[testing.md](testing.md#conformance)) against sidecache
on the embedded store in front of the suite's own origin, with the configs in
\`tests/conformance/\`. nginx and Varnish are the suite's published results.

Each test counts by its own outcome: a test whose prerequisite
(\`depends_on\`) failed is still judged by what it asserted. The suite's own
scoring, which fails the dependants of a failed test, is the last row.
Passes are out of the tests each cache ran.

${table}

${sections.join('\n\n')}
`
  fs.writeFileSync(markdownOut, md)
}
