/**
 * Where Python keeps installed packages on this machine, for finding the CUDA libraries that
 * PyTorch's wheels bring (`site-packages/nvidia/<package>/lib`): NCCL and nvJPEG are often
 * there and nowhere else.
 *
 * @module
 */

function names(dir: string): string[] {
  try {
    return [...Deno.readDirSync(dir)].map((e) => e.name).sort();
  } catch {
    return [];
  }
}

/**
 * The `site-packages` and `dist-packages` folders of every `python3*` under /usr/local/lib,
 * /usr/lib, ~/.local/lib and `$VIRTUAL_ENV/lib`, in that order (existing or not: a caller
 * tries each path it builds).
 *
 * @returns The folders.
 * @example
 * ```ts
 * import { pythonPackageDirs } from "./python_packages.ts";
 * import assert from "node:assert";
 * assert.ok(pythonPackageDirs().every((d) => /\/python3[^/]*\/(site|dist)-packages$/.test(d)));
 * ```
 */
export function pythonPackageDirs(): string[] {
  const roots = ["/usr/local/lib", "/usr/lib"];
  const home = Deno.env.get("HOME");
  if (home) roots.push(`${home}/.local/lib`);
  const venv = Deno.env.get("VIRTUAL_ENV");
  if (venv) roots.push(`${venv}/lib`);
  const out: string[] = [];
  for (const root of roots) {
    for (const py of names(root).filter((n) => /^python3(\.\d+)?$/.test(n))) {
      for (const sub of ["site-packages", "dist-packages"]) out.push(`${root}/${py}/${sub}`);
    }
  }
  return out;
}

/**
 * The files under `<packages>/nvidia/<any package>/lib/` whose names match `file`, in every
 * folder of {@linkcode pythonPackageDirs}.
 *
 * @param file The library's file name pattern, e.g. `/^libnvjpeg\.so\.\d+$/`.
 * @returns Their paths.
 * @example
 * ```ts
 * import { nvidiaWheelLibraries } from "./python_packages.ts";
 * import assert from "node:assert";
 * assert.ok(nvidiaWheelLibraries(/^libnvjpeg\.so\.\d+$/).every((p) => p.includes("/nvidia/")));
 * ```
 */
export function nvidiaWheelLibraries(file: RegExp): string[] {
  const out: string[] = [];
  for (const dir of pythonPackageDirs()) {
    for (const pkg of names(`${dir}/nvidia`)) {
      for (const f of names(`${dir}/nvidia/${pkg}/lib`)) {
        if (file.test(f)) out.push(`${dir}/nvidia/${pkg}/lib/${f}`);
      }
    }
  }
  return out;
}
