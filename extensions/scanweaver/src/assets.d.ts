/** Style sheets imported as text by the snapshot script (esbuild's text loader). */
declare module '*.css' {
  const text: string;
  export default text;
}
