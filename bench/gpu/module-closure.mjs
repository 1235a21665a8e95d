// The node_modules folders that the packages named on the command line need (their
// dependencies, optional and peer dependencies, resolved as Node resolves them), one per line:
// what bench/gpu/pack-for-device.sh packs for the GPU host.
import { existsSync, readFileSync } from "node:fs";
import { join, dirname } from "node:path";
const roots = process.argv.slice(2);
const seen = new Set();
function resolve(from, name) {
  for (let d = from; ; d = dirname(d)) {
    const p = join(d, "node_modules", name);
    if (existsSync(join(p, "package.json"))) return p;
    if (d === "." || d === "/" || dirname(d) === d) return null;
  }
}
const queue = roots.map((r) => join("node_modules", r));
while (queue.length) {
  const p = queue.shift();
  if (seen.has(p)) continue;
  seen.add(p);
  const pkg = JSON.parse(readFileSync(join(p, "package.json"), "utf8"));
  for (const dep of Object.keys({ ...pkg.dependencies, ...pkg.optionalDependencies, ...pkg.peerDependencies })) {
    const r = resolve(p, dep) ?? resolve(".", dep);
    if (r) queue.push(r);
  }
}
console.log([...seen].sort().join("\n"));
